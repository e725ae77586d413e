//! What the kernel has loaded and attached, listed through bpf(2) as `doctor` reads object
//! info: every program with its name, every link with the program it attaches
//! (`BPF_PROG_GET_NEXT_ID`, `BPF_LINK_GET_NEXT_ID`, then `BPF_OBJ_GET_INFO_BY_FD` on a
//! descriptor from `BPF_*_GET_FD_BY_ID`). The tests read it to prove that a run, however it
//! ended, left no program of its own loaded or attached.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

use crate::bpf::missed::{bpf, object_info};

const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_GET_NEXT_ID: libc::c_long = 31;
/// `offsetof(struct bpf_prog_info, name)` and its size, `BPF_OBJ_NAME_LEN`.
const PROG_NAME: usize = 64;
const NAME_LEN: usize = 16;
/// `offsetof(struct bpf_link_info, prog_id)`.
const LINK_PROG_ID: usize = 8;

/// A loaded program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    pub id: u32,
    /// The kernel keeps the first 15 bytes of the name.
    pub name: String,
}

/// A bpf link (`struct bpf_link`): an attachment of a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BpfLink {
    pub id: u32,
    pub program: u32,
}

/// The `GET_NEXT_ID` and `GET_FD_BY_ID` attributes: an id, the next one, open flags.
#[repr(C)]
struct IdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

/// Every id of one kind, in order.
fn ids(next: libc::c_long) -> std::io::Result<Vec<u32>> {
    let mut ids = Vec::new();
    let mut attr = IdAttr {
        id: 0,
        next_id: 0,
        open_flags: 0,
    };
    loop {
        // SAFETY: the attribute holds no pointers.
        match unsafe { bpf(next, &mut attr) } {
            Ok(_) => {
                ids.push(attr.next_id);
                attr.id = attr.next_id;
            }
            // ENOENT: past the last one.
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(ids),
            Err(err) => return Err(err),
        }
    }
}

/// The object with `id` and its info, if it still exists.
fn info(by_id: libc::c_long, id: u32, info: &mut [u8]) -> std::io::Result<bool> {
    let mut attr = IdAttr {
        id,
        next_id: 0,
        open_flags: 0,
    };
    // SAFETY: the attribute holds no pointers; a non-negative result is a new descriptor.
    let fd = match unsafe { bpf(by_id, &mut attr) } {
        Ok(fd) => unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).unwrap_or(-1)) },
        // Gone between the listing and now.
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
        Err(err) => return Err(err),
    };
    object_info(fd.as_raw_fd(), info)?;
    Ok(true)
}

/// Every program the kernel has loaded.
///
/// # Errors
/// When the kernel refuses the listing (no `CAP_SYS_ADMIN`).
pub fn programs() -> std::io::Result<Vec<Program>> {
    let mut programs = Vec::new();
    for id in ids(BPF_PROG_GET_NEXT_ID)? {
        let mut buf = [0u8; PROG_NAME + NAME_LEN];
        if info(BPF_PROG_GET_FD_BY_ID, id, &mut buf)? {
            let name = &buf[PROG_NAME..];
            let len = name.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
            programs.push(Program {
                id,
                name: String::from_utf8_lossy(&name[..len]).into_owned(),
            });
        }
    }
    Ok(programs)
}

/// Every link the kernel has.
///
/// # Errors
/// When the kernel refuses the listing (no `CAP_SYS_ADMIN`).
pub fn links() -> std::io::Result<Vec<BpfLink>> {
    let mut links = Vec::new();
    for id in ids(BPF_LINK_GET_NEXT_ID)? {
        let mut buf = [0u8; LINK_PROG_ID + 4];
        if info(BPF_LINK_GET_FD_BY_ID, id, &mut buf)? {
            let program = u32::from_ne_bytes(
                buf[LINK_PROG_ID..LINK_PROG_ID + 4]
                    .try_into()
                    .unwrap_or_default(),
            );
            links.push(BpfLink { id, program });
        }
    }
    Ok(links)
}
