//! A small NBD client: fixed-newstyle handshake with `NBD_OPT_GO`, simple
//! replies, pipelined requests. Used by `nbd-loadgen` and by tests; it
//! speaks to any NBD server.

use std::io::{self, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::codec::{self, InfoRequest, OptionHeader, OptionReplyHeader, ReplyHeader, Request};
use crate::proto::*;

/// Where to connect.
#[derive(Clone, Debug)]
pub enum Address {
    Tcp(String),
    Unix(std::path::PathBuf),
}

impl std::str::FromStr for Address {
    type Err = String;
    /// `unix:PATH`, a path containing `/`, or `HOST:PORT`.
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            Ok(Self::Unix(p.into()))
        } else if s.contains('/') {
            Ok(Self::Unix(s.into()))
        } else if s.contains(':') {
            Ok(Self::Tcp(s.into()))
        } else {
            Err(format!("{s:?} is neither HOST:PORT nor a unix socket path"))
        }
    }
}

/// Send half of a connection.
pub struct ClientWriter {
    w: Box<dyn Write + Send>,
    buf: Vec<u8>,
}

/// Receive half of a connection.
pub struct ClientReader {
    r: BufReader<Box<dyn Read + Send>>,
}

/// A negotiated connection.
pub struct Client {
    pub writer: ClientWriter,
    pub reader: ClientReader,
    pub size_bytes: u64,
    pub transmission_flags: u16,
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

impl Client {
    pub fn connect(addr: &Address, export: &str) -> io::Result<Self> {
        let (r, w): (Box<dyn Read + Send>, Box<dyn Write + Send>) = match addr {
            Address::Tcp(a) => {
                let s = TcpStream::connect(a)?;
                s.set_nodelay(true)?;
                (Box::new(s.try_clone()?), Box::new(s))
            }
            Address::Unix(p) => {
                let s = UnixStream::connect(Path::new(p))?;
                (Box::new(s.try_clone()?), Box::new(s))
            }
        };
        Self::handshake(r, w, export)
    }

    /// Negotiates `export` over an already-connected stream.
    pub fn handshake(
        r: Box<dyn Read + Send>,
        mut w: Box<dyn Write + Send>,
        export: &str,
    ) -> io::Result<Self> {
        let mut r = BufReader::with_capacity(256 << 10, r);
        let mut hello = [0u8; 18];
        r.read_exact(&mut hello)?;
        if hello[..8] != INIT_PASSWD.to_be_bytes() || hello[8..16] != IHAVEOPT.to_be_bytes() {
            return Err(bad("not a newstyle NBD server"));
        }
        let hflags = u16::from_be_bytes([hello[16], hello[17]]);
        if hflags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(bad("server does not speak fixed newstyle"));
        }
        let mut cflags = FLAG_C_FIXED_NEWSTYLE;
        if hflags & FLAG_NO_ZEROES != 0 {
            cflags |= FLAG_C_NO_ZEROES;
        }
        w.write_all(&cflags.to_be_bytes())?;
        let data = codec::encode_info_request(&InfoRequest {
            export: export.into(),
            info_types: vec![INFO_BLOCK_SIZE],
        });
        let mut msg = OptionHeader {
            option: OPT_GO,
            length: data.len() as u32,
        }
        .encode()
        .to_vec();
        msg.extend_from_slice(&data);
        w.write_all(&msg)?;
        w.flush()?;
        let mut size_flags = None;
        loop {
            let mut hb = [0u8; OptionReplyHeader::BYTES];
            r.read_exact(&mut hb)?;
            let h = OptionReplyHeader::decode(&hb).map_err(|e| bad(e.to_string()))?;
            if h.length > 1 << 20 {
                return Err(bad("option reply too large"));
            }
            let mut body = vec![0u8; h.length as usize];
            r.read_exact(&mut body)?;
            match h.reply_type {
                REP_INFO if body.len() >= 12 && body[..2] == INFO_EXPORT.to_be_bytes() => {
                    let size = u64::from_be_bytes(body[2..10].try_into().unwrap_or([0; 8]));
                    let flags = u16::from_be_bytes([body[10], body[11]]);
                    size_flags = Some((size, flags));
                }
                REP_ACK => break,
                t if t & REP_FLAG_ERROR != 0 => {
                    return Err(bad(format!(
                        "server refused export {export:?}: reply 0x{t:x} {}",
                        String::from_utf8_lossy(&body)
                    )))
                }
                _ => {}
            }
        }
        let (size_bytes, transmission_flags) =
            size_flags.ok_or_else(|| bad("server sent no NBD_INFO_EXPORT"))?;
        Ok(Self {
            writer: ClientWriter { w, buf: Vec::new() },
            reader: ClientReader { r },
            size_bytes,
            transmission_flags,
        })
    }

    /// One request, waiting for its reply. Returns the read data (empty for
    /// other commands) or the server's error value.
    pub fn call(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> io::Result<Result<Vec<u8>, u32>> {
        let cookie = 0x6a62_6465_7600_0000;
        self.writer
            .queue(kind, flags, cookie, offset, length, payload)?;
        self.writer.flush()?;
        let read_len = if kind == CMD_READ { length as usize } else { 0 };
        let (c, res) = self.reader.recv(|_| read_len)?;
        if c != cookie {
            return Err(bad("reply for an unknown cookie"));
        }
        Ok(res)
    }

    /// Sends NBD_CMD_DISC and closes.
    pub fn disconnect(mut self) -> io::Result<()> {
        self.writer.queue(CMD_DISC, 0, 0, 0, 0, &[])?;
        self.writer.flush()
    }
}

impl ClientWriter {
    /// Buffers a request (header and payload); [`ClientWriter::flush`]
    /// sends everything buffered in one write.
    pub fn queue(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> io::Result<()> {
        let h = Request {
            flags,
            kind,
            cookie,
            offset,
            length: length.into(),
        }
        .encode()
        .map_err(|e| bad(e.to_string()))?;
        self.buf.extend_from_slice(&h);
        self.buf.extend_from_slice(payload);
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.w.write_all(&self.buf)?;
            self.buf.clear();
        }
        self.w.flush()
    }

    /// Sends NBD_CMD_DISC.
    pub fn disconnect(mut self) -> io::Result<()> {
        self.queue(CMD_DISC, 0, 0, 0, 0, &[])?;
        self.flush()
    }
}

impl ClientReader {
    /// Receives one simple reply. `read_len(cookie)` says how many data
    /// bytes follow a successful reply to that cookie (0 for non-reads).
    pub fn recv(
        &mut self,
        read_len: impl Fn(u64) -> usize,
    ) -> io::Result<(u64, Result<Vec<u8>, u32>)> {
        let mut hb = [0u8; SIMPLE_REPLY_BYTES];
        self.r.read_exact(&mut hb)?;
        match ReplyHeader::decode(&hb).map_err(|e| bad(e.to_string()))? {
            ReplyHeader::Simple { error, cookie } => {
                if error != 0 {
                    return Ok((cookie, Err(error)));
                }
                let mut data = vec![0u8; read_len(cookie)];
                self.r.read_exact(&mut data)?;
                Ok((cookie, Ok(data)))
            }
            ReplyHeader::Chunk { .. } | ReplyHeader::Extended { .. } => {
                Err(bad("structured reply without negotiation"))
            }
        }
    }
}
