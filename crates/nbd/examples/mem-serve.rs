//! Serves an in-memory export (no volume) on 127.0.0.1:PORT: measures the
//! protocol layer alone, e.g. with `nbd-loadgen`.
//!
//! `cargo run --release -p jbdev-nbd --example mem-serve -- 10899 1073741824`
#![deny(unsafe_code)]

use std::sync::Arc;

use jbdev_nbd::{Export, ExportSet, Listener, MemBackend, Server, ServerConfig};

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(10899);
    let size: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1 << 30);
    let backend = Arc::new(MemBackend::new(size, false));
    let exports = ExportSet::new(vec![Export::new("mem", "in-memory export", backend)])
        .map_err(std::io::Error::other)?;
    let server = Server::new(exports, ServerConfig::default());
    let l = std::net::TcpListener::bind(("127.0.0.1", port))?;
    eprintln!("mem-serve: listening on 127.0.0.1:{port}");
    server.run_with_signals(vec![Listener::Tcp(l)])
}
