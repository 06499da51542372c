//! Connected byte streams and listening sockets: TCP, unix sockets, stdio
//! and sockets passed by socket activation.

use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

/// The reading half of a connection on the network threads: the socket's
/// own half, or (after STARTTLS) [`crate::tls`]'s.
pub(crate) type AsyncIn = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a connection on the network threads.
pub(crate) type AsyncOut = Box<dyn AsyncWrite + Send + Unpin>;

/// Out-of-band control of a connection's stream, usable from any thread
/// while the network threads own the stream itself (a duplicate of the
/// socket's descriptor).
pub trait StreamControl: Send + Sync {
    /// Shuts the stream down both ways: a pending read sees end-of-stream,
    /// further writes fail.
    fn shutdown(&self);

    /// Bytes written to the socket that the peer has not taken yet (the
    /// send queue), if the stream can tell: it falls as the client reads.
    fn unsent_bytes(&self) -> Option<u64> {
        None
    }
}

/// The socket's send queue (`SIOCOUTQ`: for TCP the bytes not yet
/// acknowledged, for a unix socket those the peer has not read).
#[allow(unsafe_code)] // one ioctl: std has no safe call for it
fn send_queue_bytes(fd: std::os::unix::io::RawFd) -> Option<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (= SIOCOUTQ) writes one int through the pointer.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    (r == 0).then(|| u64::try_from(n).ok()).flatten()
}

impl StreamControl for TcpStream {
    fn shutdown(&self) {
        let _ = TcpStream::shutdown(self, Shutdown::Both);
    }
    fn unsent_bytes(&self) -> Option<u64> {
        send_queue_bytes(std::os::unix::io::AsRawFd::as_raw_fd(self))
    }
}

impl StreamControl for UnixStream {
    fn shutdown(&self) {
        let _ = UnixStream::shutdown(self, Shutdown::Both);
    }
    fn unsent_bytes(&self) -> Option<u64> {
        send_queue_bytes(std::os::unix::io::AsRawFd::as_raw_fd(self))
    }
}

/// Control for streams that cannot be shut down (pipes).
pub(crate) struct NoControl;
impl StreamControl for NoControl {
    fn shutdown(&self) {}
}

/// What a [`Stream`] is connected through.
enum StreamIo {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// Standard input and output that are not a socket (pipes): read and
    /// written through tokio's blocking bridge (see [`crate::server`]).
    Stdio,
}

/// A connected byte stream, handed to the server's network threads, which
/// split it into an async reading and writing half. `control` acts on the
/// socket from any thread (shutdown).
pub struct Stream {
    io: StreamIo,
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
            control: Arc::new(s.try_clone()?),
            io: StreamIo::Tcp(s),
            peer,
        })
    }

    pub fn from_unix(s: UnixStream) -> io::Result<Self> {
        Ok(Self {
            control: Arc::new(s.try_clone()?),
            io: StreamIo::Unix(s),
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
        Ok(Self {
            io: StreamIo::Stdio,
            control: Arc::new(NoControl),
            peer: "stdio".into(),
        })
    }

    /// The async halves. Must run on the server's runtime (the sockets are
    /// registered with its reactor).
    pub(crate) fn into_async(self) -> io::Result<(AsyncIn, AsyncOut)> {
        match self.io {
            StreamIo::Tcp(s) => {
                s.set_nonblocking(true)?;
                let (r, w) = tokio::net::TcpStream::from_std(s)?.into_split();
                Ok((Box::new(r), Box::new(w)))
            }
            StreamIo::Unix(s) => {
                s.set_nonblocking(true)?;
                let (r, w) = tokio::net::UnixStream::from_std(s)?.into_split();
                Ok((Box::new(r), Box::new(w)))
            }
            StreamIo::Stdio => Ok((Box::new(tokio::io::stdin()), Box::new(tokio::io::stdout()))),
        }
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

/// A listener registered with the server's runtime.
pub(crate) enum AsyncListener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl AsyncListener {
    pub(crate) async fn accept(&self) -> io::Result<Stream> {
        match self {
            Self::Tcp(l) => Stream::from_tcp(l.accept().await?.0.into_std()?),
            Self::Unix(l) => Stream::from_unix(l.accept().await?.0.into_std()?),
        }
    }
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

    /// Registers the socket with the runtime (must run on it).
    pub(crate) fn into_async(self) -> io::Result<AsyncListener> {
        match self {
            Self::Tcp(l) => {
                l.set_nonblocking(true)?;
                Ok(AsyncListener::Tcp(tokio::net::TcpListener::from_std(l)?))
            }
            Self::Unix { listener, .. } => {
                listener.set_nonblocking(true)?;
                Ok(AsyncListener::Unix(tokio::net::UnixListener::from_std(
                    listener,
                )?))
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
