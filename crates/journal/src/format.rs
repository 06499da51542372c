//! jbd2 on-disk structures (being written).
