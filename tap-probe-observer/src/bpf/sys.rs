//! What the loader needs of `bpf(2)` and the maps' fdinfo that aya does not offer: removing
//! an entry from an array of maps, reading consecutive entries of an array in one call, and
//! reading a map's fdinfo fields.

use std::os::fd::RawFd;

/// `BPF_MAP_DELETE_ELEM` (`include/uapi/linux/bpf.h`).
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;

/// The part of `union bpf_attr` that `BPF_MAP_DELETE_ELEM` reads.
#[repr(C)]
struct DeleteAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
}

/// Removes `key` from the map behind `fd` (an array of maps releases the inner map).
///
/// # Errors
/// What the kernel answered.
pub(crate) fn map_delete(fd: RawFd, key: &u32) -> std::io::Result<()> {
    let attr = DeleteAttr {
        map_fd: u32::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?,
        pad: 0,
        key: std::ptr::from_ref(key) as u64,
    };
    // SAFETY: `attr` is a valid bpf_attr prefix for the command, and `key` outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_DELETE_ELEM,
            std::ptr::from_ref(&attr),
            size_of::<DeleteAttr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `BPF_MAP_LOOKUP_BATCH` (Linux 5.6+ for arrays).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The part of `union bpf_attr` the batch commands read.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Entries `first .. first + count` of the array behind `fd`, whose values take `size` bytes
/// each in the kernel's copy (a per-CPU array's: the value rounded up to 8, times the
/// possible CPUs), in one call: the bytes of each, in order.
///
/// # Errors
/// What the kernel answered, or fewer entries than asked for.
pub(crate) fn array_lookup_batch(
    fd: RawFd,
    first: u32,
    count: u32,
    size: usize,
) -> std::io::Result<Vec<u8>> {
    let mut keys = vec![0u32; count as usize];
    let mut values = vec![0u8; size * count as usize];
    // The batch starts after the key it is given: none for the first entry.
    let previous = first.wrapping_sub(1);
    let mut next = 0u32;
    let mut attr = BatchAttr {
        in_batch: if first == 0 {
            0
        } else {
            std::ptr::from_ref(&previous) as u64
        },
        out_batch: std::ptr::from_mut(&mut next) as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count,
        map_fd: u32::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?,
        ..BatchAttr::default()
    };
    // SAFETY: `attr` is the command's bpf_attr prefix; its buffers hold `count` keys and
    // values and outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_BATCH,
            std::ptr::from_mut(&mut attr),
            size_of::<BatchAttr>(),
        )
    };
    // ENOENT: the array ended; the entries before its end are there.
    if rc < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT) {
        return Err(std::io::Error::last_os_error());
    }
    if attr.count != count || keys.first().is_some_and(|&k| k != first) {
        return Err(std::io::Error::other(format!(
            "a batch lookup of {count} entries from {first} gave {} from {:?}",
            attr.count,
            keys.first()
        )));
    }
    Ok(values)
}

/// A numeric field of an fdinfo text.
pub(crate) fn fdinfo_field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == name).then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_fields_are_read_by_name() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1055\nmap_type:\t6\n\
                    key_size:\t4\nvalue_size:\t40\nmax_entries:\t128\nmap_flags:\t0x0\n\
                    map_extra:\t0x0\nmemlock:\t10496\nmap_id:\t42\nfrozen:\t0\n";
        assert_eq!(fdinfo_field(text, "memlock"), Some(10_496));
        assert_eq!(fdinfo_field(text, "map_type"), Some(6));
        assert_eq!(fdinfo_field(text, "value_size"), Some(40));
        assert_eq!(fdinfo_field(text, "owner_prog_type"), None);
    }

    #[test]
    fn deleting_from_a_closed_descriptor_is_an_error() {
        let err = map_delete(-1, &0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
    }
}
