//! Why a trace file could not be read.

use std::fmt;
use std::io;

use crate::FORMAT_VERSION;

/// Why a trace file could not be read, and where.
#[derive(Debug)]
pub enum TraceError {
    /// The file ended inside `what`, which started at byte `offset`.
    Truncated {
        offset: u64,
        what: &'static str,
    },
    /// The first bytes are not [`crate::MAGIC`].
    BadMagic,
    UnsupportedVersion {
        found: u16,
    },
    /// `what` at byte `offset` is not valid.
    Corrupt {
        offset: u64,
        what: String,
    },
    ChecksumMismatch {
        offset: u64,
        stored: u32,
        computed: u32,
    },
    Io {
        offset: u64,
        source: io::Error,
    },
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { offset, what } => {
                write!(f, "truncated {what} at byte {offset}")
            }
            Self::BadMagic => {
                f.write_str("not a tap-probe trace: bad magic at byte 0 (expected \"TAPTRACE\")")
            }
            Self::UnsupportedVersion { found } => write!(
                f,
                "unsupported format version {found} at byte 8 (this tap-probe reads \
                 {FORMAT_VERSION})"
            ),
            Self::Corrupt { offset, what } => write!(f, "corrupt trace at byte {offset}: {what}"),
            Self::ChecksumMismatch {
                offset,
                stored,
                computed,
            } => write!(
                f,
                "checksum mismatch at byte {offset}: the trailer says {stored:08x}, the \
                 content gives {computed:08x}"
            ),
            Self::Io { offset, source } => write!(f, "read error at byte {offset}: {source}"),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
