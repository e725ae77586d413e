//! What the loader needs of `bpf(2)` and the maps' fdinfo that aya does not offer: removing
//! an entry from an array of maps, and reading a map's fdinfo fields.

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
