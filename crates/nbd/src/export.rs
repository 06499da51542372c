//! Exports: the names clients ask for, their operator-set descriptions and
//! the backends behind them.

use std::sync::Arc;

use crate::backend::Backend;

/// One export: a name clients ask for and the backend behind it.
pub struct Export {
    pub name: String,
    /// Set by the operator, shown to any client that lists exports; empty
    /// for none. Never derived from the backing path.
    pub description: String,
    pub backend: Arc<dyn Backend>,
    /// Advertised minimum block size (1: any alignment works).
    pub min_block_bytes: u32,
    /// Where its requests' jobs queue for the workers: the server caps how
    /// many workers one export may hold (see [`crate::pool::Lane`]).
    pub lane: Arc<crate::pool::Lane>,
}

impl Export {
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        backend: Arc<dyn Backend>,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            backend,
            min_block_bytes: 1,
            lane: Arc::default(),
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.backend.size_bytes()
    }
}

/// Whether an export's name and description can be sent to clients: at
/// most 4096 bytes each (the protocol's string limit; a LIST reply carries
/// both in one 32-bit-sized pair), no NUL. A server checks this before it
/// opens anything.
pub fn check_export_strings(name: &str, description: &str) -> Result<(), String> {
    let shown = |s: &str| {
        // A name too long to send is too long to print whole.
        let head: String = s.chars().take(40).collect();
        if head.len() < s.len() {
            format!("{head:?}... ({} bytes)", s.len())
        } else {
            format!("{s:?}")
        }
    };
    if name.len() > crate::proto::MAX_STRING_BYTES || name.contains('\0') {
        return Err(format!(
            "export name {} is longer than 4096 bytes or contains NUL",
            shown(name)
        ));
    }
    if description.len() > crate::proto::MAX_STRING_BYTES || description.contains('\0') {
        return Err(format!(
            "description of export {} is longer than 4096 bytes or contains NUL",
            shown(name)
        ));
    }
    Ok(())
}

/// The exports of a server; the first one is also the default export (the
/// empty name).
pub struct ExportSet {
    exports: Vec<Arc<Export>>,
}

impl ExportSet {
    /// Fails on an empty set or a repeated name.
    pub fn new(exports: Vec<Export>) -> Result<Self, String> {
        if exports.is_empty() {
            return Err("no export to serve".into());
        }
        for (i, e) in exports.iter().enumerate() {
            if exports[..i].iter().any(|o| o.name == e.name) {
                return Err(format!("export name {:?} given twice", e.name));
            }
            check_export_strings(&e.name, &e.description)?;
        }
        Ok(Self {
            exports: exports.into_iter().map(Arc::new).collect(),
        })
    }

    /// The export called `name`; the empty name is the default export.
    pub fn find(&self, name: &str) -> Option<Arc<Export>> {
        if name.is_empty() {
            return self.exports.first().cloned();
        }
        self.exports.iter().find(|e| e.name == name).cloned()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Export>> {
        self.exports.iter()
    }
}
