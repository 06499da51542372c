//! Fuzzes the decoders that see bytes from a socket: option headers and
//! option data (every option type), compact and extended request headers
//! and their validation,
//! and the reply decoders a client uses. None may panic; decoded requests
//! must re-encode to the same bytes; validation must never accept a request
//! outside the export.
#![no_main]

use jbdev_nbd::codec::{self, ExportContext, HeaderMode, OptionHeader, ReplyHeader, Request};
use jbdev_nbd::proto::*;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let _ = OptionHeader::decode(rest);
    let _ = codec::OptionReplyHeader::decode(rest);
    let _ = ReplyHeader::decode(rest);
    // Option data under a chosen option type (0..=12 covers every known one).
    let option = u32::from(selector % 13);
    if let Ok(opt) = codec::parse_option(option, rest) {
        // Re-encoding what we parsed must parse back to the same thing.
        match &opt {
            codec::ClientOption::Go(r) | codec::ClientOption::Info(r) => {
                let again = codec::parse_option(option, &codec::encode_info_request(r));
                assert_eq!(again.as_ref(), Ok(&opt));
            }
            codec::ClientOption::ListMetaContext(q) | codec::ClientOption::SetMetaContext(q) => {
                let again = codec::parse_option(option, &codec::encode_meta_query(q));
                assert_eq!(again.as_ref(), Ok(&opt));
            }
            _ => {}
        }
    }
    // Request headers in the mode the selector picks: compact (28 bytes,
    // 32-bit length) or extended (32 bytes, 64-bit length).
    let extended = selector & 0x80 != 0;
    let mode = if extended {
        HeaderMode::Extended
    } else {
        HeaderMode::Compact
    };
    if let Ok(req) = Request::decode(mode, rest) {
        if extended {
            let enc = req.encode_extended();
            assert_eq!(&enc[..], &rest[..EXTENDED_HEADER_BYTES]);
        } else {
            let enc = req.encode().expect("compact request re-encodes");
            assert_eq!(&enc[..], &rest[..REQUEST_HEADER_BYTES]);
        }
        let ctx = ExportContext {
            size_bytes: 1 << 30,
            read_only: selector & 0x10 != 0,
            structured_replies: extended || selector & 0x20 != 0,
            base_allocation: selector & 0x40 != 0,
            extended_headers: extended,
        };
        if let Ok(cmd) = codec::validate(&req, &ctx) {
            let range = match cmd {
                codec::Command::Read { offset, length, .. }
                | codec::Command::Write { offset, length, .. } => Some((offset, u64::from(length))),
                codec::Command::Trim { offset, length, .. }
                | codec::Command::Cache { offset, length }
                | codec::Command::WriteZeroes { offset, length, .. }
                | codec::Command::BlockStatus { offset, length, .. } => Some((offset, length)),
                _ => None,
            };
            if let Some((off, len)) = range {
                assert!(off.checked_add(len).is_some_and(|e| e <= ctx.size_bytes));
            }
            // Whatever was accepted carries no payload beyond the maximum.
            assert!(req.payload_bytes_in(mode) <= u64::from(MAX_PAYLOAD_BYTES));
        }
    }
});
