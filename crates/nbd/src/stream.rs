//! Connected byte streams and listening sockets: TCP, unix sockets, stdio
//! and sockets passed by socket activation.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Out-of-band control of a connection's stream.
pub trait StreamControl: Send + Sync {
    /// Shuts the stream down both ways: a blocked reader sees end-of-stream,
    /// further writes fail.
    fn shutdown(&self);
    /// Shuts down only the read side (server shutdown: finish what was read).
    fn shutdown_read(&self);
    fn set_read_timeout(&self, t: Option<Duration>);
    /// Bounds how long one write may block: a client that stops reading
    /// its replies makes writes fail after this and is dropped.
    fn set_write_timeout(&self, t: Option<Duration>);
}

impl StreamControl for TcpStream {
    fn shutdown(&self) {
        let _ = TcpStream::shutdown(self, Shutdown::Both);
    }
    fn shutdown_read(&self) {
        let _ = TcpStream::shutdown(self, Shutdown::Read);
    }
    fn set_read_timeout(&self, t: Option<Duration>) {
        let _ = TcpStream::set_read_timeout(self, t);
    }
    fn set_write_timeout(&self, t: Option<Duration>) {
        let _ = TcpStream::set_write_timeout(self, t);
    }
}

impl StreamControl for UnixStream {
    fn shutdown(&self) {
        let _ = UnixStream::shutdown(self, Shutdown::Both);
    }
    fn shutdown_read(&self) {
        let _ = UnixStream::shutdown(self, Shutdown::Read);
    }
    fn set_read_timeout(&self, t: Option<Duration>) {
        let _ = UnixStream::set_read_timeout(self, t);
    }
    fn set_write_timeout(&self, t: Option<Duration>) {
        let _ = UnixStream::set_write_timeout(self, t);
    }
}

/// Control for streams that cannot be shut down (pipes).
pub(crate) struct NoControl;
impl StreamControl for NoControl {
    fn shutdown(&self) {}
    fn shutdown_read(&self) {}
    fn set_read_timeout(&self, _t: Option<Duration>) {}
    fn set_write_timeout(&self, _t: Option<Duration>) {}
}

/// A connected byte stream split into halves. After STARTTLS the halves are
/// wrapped in [`crate::tls`]'s, which share one session; `control` still
/// acts on the socket (timeouts, shutdown).
pub struct Stream {
    pub reader: Box<dyn Read + Send>,
    pub writer: Box<dyn Write + Send>,
    pub control: Arc<dyn StreamControl>,
    pub peer: String,
}

impl Stream {
    pub fn from_tcp(s: TcpStream) -> io::Result<Self> {
        // The spec recommends TCP_NODELAY: replies are small and latency-bound.
        s.set_nodelay(true)?;
        let peer = s
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "tcp".into());
        Ok(Self {
            reader: Box::new(s.try_clone()?),
            control: Arc::new(s.try_clone()?),
            writer: Box::new(s),
            peer,
        })
    }

    pub fn from_unix(s: UnixStream) -> io::Result<Self> {
        Ok(Self {
            reader: Box::new(s.try_clone()?),
            control: Arc::new(s.try_clone()?),
            writer: Box::new(s),
            peer: "unix".into(),
        })
    }

    /// Standard input and output (`jbdev serve -s`, libnbd's
    /// `connect_command`): if stdin is a socket (the usual socketpair) it is
    /// used both ways; otherwise stdin is read and stdout written.
    pub fn from_stdio() -> io::Result<Self> {
        use std::os::fd::AsFd;
        let fd = io::stdin().as_fd().try_clone_to_owned()?;
        let sock = UnixStream::from(fd);
        if sock.local_addr().is_ok() {
            let mut s = Self::from_unix(sock)?;
            s.peer = "stdin".into();
            return Ok(s);
        }
        let input = std::fs::File::from(io::stdin().as_fd().try_clone_to_owned()?);
        let output = std::fs::File::from(io::stdout().as_fd().try_clone_to_owned()?);
        Ok(Self {
            reader: Box::new(input),
            writer: Box::new(output),
            control: Arc::new(NoControl),
            peer: "stdio".into(),
        })
    }
}

/// A listening socket.
pub enum Listener {
    Tcp(TcpListener),
    /// A unix socket; `unlink` is removed when the server stops (set for
    /// sockets the server created itself).
    Unix {
        listener: UnixListener,
        unlink: Option<PathBuf>,
    },
}

impl Listener {
    pub fn describe(&self) -> String {
        match self {
            Self::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "tcp".into()),
            Self::Unix { listener, .. } => listener
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
                .unwrap_or_else(|| "unix socket".into()),
        }
    }

    pub(crate) fn accept(&self) -> io::Result<Stream> {
        match self {
            Self::Tcp(l) => Stream::from_tcp(l.accept()?.0),
            Self::Unix { listener, .. } => Stream::from_unix(listener.accept()?.0),
        }
    }

    /// Connects to the listener so that a blocked `accept` returns.
    pub(crate) fn wake(&self) {
        match self {
            Self::Tcp(l) => {
                if let Ok(mut a) = l.local_addr() {
                    if a.ip().is_unspecified() {
                        a.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                    }
                    let _ = TcpStream::connect_timeout(&a, Duration::from_millis(200));
                }
            }
            Self::Unix { listener, .. } => {
                if let Some(p) = listener
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_pathname().map(|p| p.to_path_buf()))
                {
                    let _ = UnixStream::connect(p);
                }
            }
        }
    }
}

/// Listening sockets passed by systemd-style socket activation
/// (`LISTEN_FDS`/`LISTEN_PID`), e.g. by `nbdinfo -- [ jbdev serve IMG ]`.
/// `Ok(None)` when the process was not socket-activated.
///
/// Uses the `listenfd` crate, which checks `LISTEN_PID` and the socket type
/// and family of each descriptor before adopting it, so this crate needs no
/// `unsafe` for `FromRawFd`.
pub fn activated_listeners() -> io::Result<Option<Vec<Listener>>> {
    let mut fds = listenfd::ListenFd::from_env();
    if fds.len() == 0 {
        return Ok(None);
    }
    let mut out = Vec::new();
    for i in 0..fds.len() {
        if let Ok(Some(l)) = fds.take_unix_listener(i) {
            out.push(Listener::Unix {
                listener: l,
                unlink: None,
            });
        } else if let Some(l) = fds.take_tcp_listener(i)? {
            out.push(Listener::Tcp(l));
        }
    }
    // Children we might start must not see the variables.
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDNAMES");
    Ok(Some(out))
}
