//! NBD protocol layer and server (being written).
#![deny(unsafe_code)]
