//! The journal in jbd2's on-disk format.
#![deny(unsafe_code)]

pub mod format;
