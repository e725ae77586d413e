//! The records' layout on disk, defined once: each record is a list of little-endian
//! fields, and the same declaration gives its length, its encoder and its decoder.

use bytes::{Buf, BufMut};

/// A little-endian field of a record.
pub(crate) trait Field: Sized {
    /// Bytes on disk.
    const LEN: usize;
    fn put(&self, out: &mut impl BufMut);
    /// Reads the field; the caller checked that `LEN` bytes remain.
    fn get(from: &mut impl Buf) -> Self;
}

macro_rules! little_endian {
    ($($ty:ty, $put:ident, $get:ident;)*) => {$(
        impl Field for $ty {
            const LEN: usize = size_of::<$ty>();
            fn put(&self, out: &mut impl BufMut) {
                out.$put(*self);
            }
            fn get(from: &mut impl Buf) -> Self {
                from.$get()
            }
        }
    )*};
}

little_endian! {
    u8, put_u8, get_u8;
    u16, put_u16_le, get_u16_le;
    u32, put_u32_le, get_u32_le;
    u64, put_u64_le, get_u64_le;
}

impl<T: Field + Copy + Default, const N: usize> Field for [T; N] {
    const LEN: usize = T::LEN * N;
    fn put(&self, out: &mut impl BufMut) {
        for field in self {
            field.put(out);
        }
    }
    fn get(from: &mut impl Buf) -> Self {
        let mut fields = [T::default(); N];
        for field in &mut fields {
            *field = T::get(from);
        }
        fields
    }
}

/// Declares a record payload: its fields in file order, its length, and how it is written
/// and read.
macro_rules! record {
    ($(#[$doc:meta])* $name:ident { $($(#[$field_doc:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub(crate) struct $name {
            $($(#[$field_doc])* pub(crate) $field: $ty,)*
        }

        impl $name {
            /// Payload bytes.
            pub(crate) const LEN: usize = 0 $(+ <$ty as Field>::LEN)*;

            pub(crate) fn put(&self, out: &mut impl BufMut) {
                $(self.$field.put(out);)*
            }

            /// Reads the payload; the caller checked that `LEN` bytes remain.
            pub(crate) fn get(from: &mut impl Buf) -> Self {
                Self { $($field: <$ty as Field>::get(from),)* }
            }
        }
    };
}

/// Per-kind counters in the trailer, indexed by the `EventKind` value (slot 0 unused).
pub const KIND_SLOTS: usize = 8;

record! {
    /// An event (type 1).
    EventRecord {
        /// `CLOCK_MONOTONIC` ns.
        ts_ns: u64,
        /// Index into the header's device table.
        device: u16,
        queue: u16,
        cpu: u16,
        /// An `EventKind` value.
        kind: u8,
        reserved: u8,
        /// `enum skb_drop_reason` for kind 7, else 0.
        reason: u32,
    }
}

record! {
    /// Events the programs could not write, noticed at `ts_ns` (type 2).
    LostRecord {
        ts_ns: u64,
        count: u64,
    }
}

record! {
    /// The trailer's counts (type 0xff), followed by the checksum of everything before it.
    TrailerCounts {
        events: u64,
        counts: [u64; KIND_SLOTS],
        lost: u64,
    }
}

/// The trailer's payload: its counts and a CRC-32.
pub(crate) const TRAILER_LEN: usize = TrailerCounts::LEN + 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_the_documented_ones() {
        // docs/trace-format.md: 20, 16 and 84 bytes.
        assert_eq!(EventRecord::LEN, 20);
        assert_eq!(LostRecord::LEN, 16);
        assert_eq!(TRAILER_LEN, 84);
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let event = EventRecord {
            ts_ns: 0x0102_0304_0506_0708,
            device: 1,
            queue: 2,
            cpu: 3,
            kind: 4,
            reserved: 0,
            reason: 5,
        };
        let mut bytes = Vec::new();
        event.put(&mut bytes);
        assert_eq!(bytes.len(), EventRecord::LEN);
        assert_eq!(&bytes[..8], &[8, 7, 6, 5, 4, 3, 2, 1], "little-endian");
        assert_eq!(EventRecord::get(&mut bytes.as_slice()), event);
    }
}
