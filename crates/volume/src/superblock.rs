//! Volume superblock (being written).
