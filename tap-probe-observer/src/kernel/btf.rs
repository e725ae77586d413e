//! Facts about the running kernel read from its BTF (`/sys/kernel/btf/vmlinux`) at run time.
//!
//! Nothing here is a constant of one kernel version: struct offsets move between releases
//! and configurations (e.g. `struct ns_common` was reworked in 6.18), and enum values such as
//! `SKB_DROP_REASON_FULL_RING` are renumbered whenever a reason is added in the middle.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result, anyhow, bail};
use btf_rs::{Btf, BtfType, Type};
use tap_probe_common::{DropClass, KernelFacts, PacketFacts, RingFacts};

/// Where the kernel exposes its own BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
/// The tun module's BTF, split against vmlinux's, where tun is a module.
pub(crate) const TUN_BTF: &str = "/sys/kernel/btf/tun";
/// `NETDEV_ALIGN` (`include/linux/netdevice.h`): where `netdev_priv()` is
/// `ALIGN(sizeof(struct net_device), NETDEV_ALIGN)` (before the `priv` flexible array of
/// Linux 6.12). A `#define`, so not in BTF; 32 since it was introduced.
const NETDEV_ALIGN: u32 = 32;

/// Bound on typedef/pointer chains and nested anonymous members; real kernels need a handful,
/// this only guards against a malformed (cyclic) BTF.
const MAX_DEPTH: usize = 32;

/// Loads the running kernel's BTF.
///
/// # Errors
/// When the kernel has no BTF, or it cannot be read or parsed.
pub fn load_vmlinux() -> Result<Btf> {
    let path = Path::new(VMLINUX_BTF);
    if !path.exists() {
        bail!(
            "{VMLINUX_BTF} is missing: this kernel has no BTF (CONFIG_DEBUG_INFO_BTF); \
             tap-probe needs it to read struct layouts"
        );
    }
    Btf::from_file(path).with_context(|| format!("reading the kernel's BTF from {VMLINUX_BTF}"))
}

/// Reads every BTF-derived field of [`KernelFacts`] from `btf`. `reader_ranges` is left empty
/// (`reader_range_count == 0`): it comes from kallsyms, see
/// [`crate::kernel::kallsyms::Kallsyms::reader_ranges`]. What only some kernels have (the
/// drop reasons, conntrack, the typed task helper) is optional: the facts say how the
/// programs do without it.
///
/// # Errors
/// Names the type or member that is missing, is a bitfield, or is not byte aligned.
pub fn kernel_facts(btf: &Btf) -> Result<KernelFacts> {
    let full_ring = full_ring_reason(btf);
    Ok(KernelFacts {
        skb_dev: offset_of(btf, "sk_buff", &["dev"])?,
        skb_queue_mapping: offset_of(btf, "sk_buff", &["queue_mapping"])?,
        dev_ifindex: offset_of(btf, "net_device", &["ifindex"])?,
        dev_net: offset_of(btf, "net_device", &["nd_net", "net"])?,
        net_inum: offset_of(btf, "net", &["ns", "inum"])?,
        dev_tx: offset_of(btf, "net_device", &["_tx"])?,
        dev_netdev_ops: offset_of(btf, "net_device", &["netdev_ops"])?,
        ops_start_xmit: offset_of(btf, "net_device_ops", &["ndo_start_xmit"])?,
        dev_num_tx_queues: offset_of(btf, "net_device", &["num_tx_queues"])?,
        txq_size: struct_size(btf, "netdev_queue")?,
        txq_state: offset_of(btf, "netdev_queue", &["state"])?,
        txq_dev: offset_of(btf, "netdev_queue", &["dev"])?,
        reason_full_ring: full_ring.unwrap_or(0),
        tx_busy: enum_value(btf, "netdev_tx", "NETDEV_TX_BUSY")?,
        drv_xoff_mask: {
            let bit = enum_value(btf, "netdev_queue_state_t", "__QUEUE_STATE_DRV_XOFF")?;
            1u32.checked_shl(bit).ok_or_else(|| {
                anyhow!("__QUEUE_STATE_DRV_XOFF is {bit}: does not fit a 32-bit state mask")
            })?
        },
        task_nvcsw: offset_of(btf, "task_struct", &["nvcsw"])?,
        skb_next: offset_of(btf, "sk_buff", &["next"])?,
        driver_count: 0,
        wake_range_count: 0,
        drop_class: if full_ring.is_some() {
            DropClass::Reason
        } else {
            DropClass::Path
        } as u32,
        skb_destructor: offset_of(btf, "sk_buff", &["destructor"])?,
        // Without conntrack (`CONFIG_NF_CONNTRACK` off) `nf_reset_ct` is empty.
        skb_nfct: offset_of(btf, "sk_buff", &["_nfct"]).unwrap_or(0),
        task_btf: u32::from(
            enum_value(btf, "bpf_func_id", "BPF_FUNC_get_current_task_btf").is_ok(),
        ),
        reserved: 0,
        drivers: Default::default(),
        wake_ranges: Default::default(),
        ring: RingFacts::default(),
        packet: PacketFacts {
            skb_protocol: offset_of(btf, "sk_buff", &["protocol"])?,
            skb_head: offset_of(btf, "sk_buff", &["head"])?,
            skb_network_header: offset_of(btf, "sk_buff", &["network_header"])?,
            skb_end: offset_of(btf, "sk_buff", &["end"])?,
            shinfo_gso_segs: offset_of(btf, "skb_shared_info", &["gso_segs"])?,
            reserved: 0,
        },
        reader_range_count: 0,
        reserved_end: 0,
        reader_ranges: Default::default(),
    })
}

/// `SKB_DROP_REASON_FULL_RING`, where `kfree_skb` carries a reason (Linux 5.17+) and tun
/// gives a full ring that one (it arrived later than the reasons); `None` elsewhere, where
/// the drops are told apart by their path ([`DropClass::Path`]).
#[must_use]
pub fn full_ring_reason(btf: &Btf) -> Option<u32> {
    let reason_argument = tracepoint_args(btf, "kfree_skb").is_ok_and(|args| args.len() >= 3);
    reason_argument
        .then(|| enum_value(btf, "skb_drop_reason", "SKB_DROP_REASON_FULL_RING").ok())
        .flatten()
}

/// Where the programs find a tun/tap's `ptr_ring`, and which BTF said so. `tun_struct` and
/// `tun_file` are tun's own: in the module's split BTF ([`TUN_BTF`]) where tun is a module,
/// in vmlinux's where it is built in; `ptr_ring` and `net_device` are vmlinux's.
///
/// # Errors
/// When tun's types are in neither (tun not loaded) or a member is missing.
pub fn ring_facts(vmlinux: &Btf) -> Result<(RingFacts, String)> {
    let module;
    let (btf, from) = if Path::new(TUN_BTF).exists() {
        module = Btf::from_split_file(TUN_BTF, vmlinux)
            .with_context(|| format!("reading tun's BTF from {TUN_BTF}"))?;
        (&module, TUN_BTF)
    } else {
        (vmlinux, VMLINUX_BTF)
    };
    if find_struct(btf, "tun_struct").is_err() {
        // `initstate` exists for modules only: tun is loaded, but its BTF is not published.
        if Path::new("/sys/module/tun/initstate").exists() {
            bail!(
                "tun is a module and this kernel publishes no BTF for modules (no {TUN_BTF}: \
                 CONFIG_DEBUG_INFO_BTF_MODULES, Linux 5.11+), so where tun keeps its ring is \
                 not known"
            );
        }
        bail!(
            "no struct tun_struct in {VMLINUX_BTF} and no {TUN_BTF}: is the tun module loaded? \
             (modprobe tun)"
        );
    }
    let dev_priv = match offset_of(vmlinux, "net_device", &["priv"]) {
        Ok(offset) => offset,
        Err(_) => struct_size(vmlinux, "net_device")?.next_multiple_of(NETDEV_ALIGN),
    };
    let fields = [
        offset_of(vmlinux, "ptr_ring", &["producer"])?,
        offset_of(vmlinux, "ptr_ring", &["consumer_head"])?,
        offset_of(vmlinux, "ptr_ring", &["size"])?,
        offset_of(vmlinux, "ptr_ring", &["queue"])?,
    ];
    let start = fields.iter().copied().min().unwrap_or(0);
    // The ints are 4 bytes, the queue pointer 8: the span ends after the last one read.
    let end = fields.iter().map(|f| f + 8).max().unwrap_or(0);
    let facts = RingFacts {
        known: 1,
        dev_priv,
        tun_tfiles: offset_of(btf, "tun_struct", &["tfiles"])?,
        tun_dev: offset_of(btf, "tun_struct", &["dev"])?,
        tfile_tx_ring: offset_of(btf, "tun_file", &["tx_ring"])?,
        span_start: start,
        span_len: end - start,
        producer: fields[0] - start,
        consumer_head: fields[1] - start,
        size: fields[2] - start,
        queue: fields[3] - start,
        reserved: 0,
    };
    if facts.span_len > RING_SPAN_MAX {
        bail!(
            "struct ptr_ring's producer..queue span is {} bytes, more than the {RING_SPAN_MAX} \
             the programs read at once",
            facts.span_len
        );
    }
    Ok((facts, from.to_owned()))
}

/// The most of `struct ptr_ring` the programs read at once (`SPAN_MAX` in
/// `tap-probe-ebpf/src/ring.rs`, less the 8 bytes a field read may run over).
const RING_SPAN_MAX: u32 = 248;

/// The whole `enum skb_drop_reason`: value to name, without the `SKB_DROP_REASON_` prefix and
/// lowercased (`SKB_DROP_REASON_FULL_RING` becomes `full_ring`). When two names share a value
/// the first one declared wins. Empty before Linux 5.17, which has no drop reasons.
pub(crate) fn drop_reason_names(btf: &Btf) -> BTreeMap<u32, String> {
    let mut names = BTreeMap::new();
    for (name, value) in enum_members(btf, "skb_drop_reason").unwrap_or_default() {
        let Ok(value) = u32::try_from(value) else {
            continue;
        };
        let short = name
            .strip_prefix("SKB_DROP_REASON_")
            .unwrap_or(&name)
            .to_ascii_lowercase();
        names.entry(value).or_insert(short);
    }
    names
}

/// The arguments `(name, C type)` of the raw tracepoint `tracepoint`, read from the typedef
/// `btf_trace_<tracepoint>`: a pointer to a function prototype whose first argument is the
/// `void *` context of the probe, which is left out.
///
/// # Errors
/// When the typedef is missing or is not shaped like a tracepoint's.
pub fn tracepoint_args(btf: &Btf, tracepoint: &str) -> Result<Vec<(String, String)>> {
    let typedef_name = format!("btf_trace_{tracepoint}");
    let typedef = btf
        .resolve_types_by_name(&typedef_name)
        .unwrap_or_default()
        .into_iter()
        .find_map(|t| match t {
            Type::Typedef(td) => Some(td),
            _ => None,
        })
        .ok_or_else(|| anyhow!("no tracepoint {tracepoint}: BTF has no typedef {typedef_name}"))?;
    let Type::Ptr(ptr) = btf.resolve_chained_type(&typedef)? else {
        bail!("typedef {typedef_name} is not a pointer to a function prototype");
    };
    let Type::FuncProto(proto) = btf.resolve_chained_type(&ptr)? else {
        bail!("typedef {typedef_name} is not a pointer to a function prototype");
    };
    let names = tracepoint_arg_names(btf, tracepoint, proto.parameters.len());
    let mut args = Vec::new();
    for (i, param) in proto.parameters.iter().enumerate().skip(1) {
        if param.is_variadic() {
            args.push(("...".to_owned(), String::new()));
            continue;
        }
        let name = names
            .as_ref()
            .and_then(|names| names.get(i).filter(|n| !n.is_empty()).cloned())
            .unwrap_or_else(|| format!("arg{}", i - 1));
        let ty = type_to_string(btf, param.get_type_id().unwrap_or(0), 0);
        args.push((name, ty));
    }
    Ok(args)
}

/// The parameter names of a tracepoint. The `btf_trace_<tp>` typedef is a function *pointer*
/// type, which carries no parameter names in DWARF and so none in BTF; the functions the
/// tracepoint macros define with the same prototype do (`__bpf_trace_<tp>` in
/// `include/trace/bpf_probe.h`, `__probestub_<tp>` and `__traceiter_<tp>` in
/// `include/linux/tracepoint.h`). `None` when none of them is in BTF with `count` parameters.
fn tracepoint_arg_names(btf: &Btf, tracepoint: &str, count: usize) -> Option<Vec<String>> {
    ["__bpf_trace_", "__probestub_", "__traceiter_"]
        .iter()
        .find_map(|prefix| {
            btf.resolve_types_by_name(&format!("{prefix}{tracepoint}"))
                .unwrap_or_default()
                .into_iter()
                .find_map(|t| {
                    let Type::Func(func) = t else { return None };
                    let Ok(Type::FuncProto(proto)) = btf.resolve_chained_type(&func) else {
                        return None;
                    };
                    (proto.parameters.len() == count).then(|| {
                        proto
                            .parameters
                            .iter()
                            .map(|p| btf.resolve_name(p).unwrap_or_default())
                            .collect()
                    })
                })
        })
}

/// `sizeof(struct name)`.
fn struct_size(btf: &Btf, name: &str) -> Result<u32> {
    let st = find_struct(btf, name)?;
    u32::try_from(st.size()).with_context(|| format!("sizeof(struct {name}) does not fit u32"))
}

/// Finds the (complete, not forward-declared) `struct name`.
fn find_struct(btf: &Btf, name: &str) -> Result<btf_rs::Struct> {
    btf.resolve_types_by_name(name)
        .unwrap_or_default()
        .into_iter()
        .find_map(|t| match t {
            Type::Struct(s) => Some(s),
            _ => None,
        })
        .ok_or_else(|| anyhow!("kernel BTF has no struct {name}"))
}

/// The byte offset of `path[0].path[1]...` inside `struct root`. Each step may sit inside
/// anonymous structs/unions; each step but the last must be (a typedef of) a struct or union.
fn offset_of(btf: &Btf, root: &str, path: &[&str]) -> Result<u32> {
    let mut container = find_struct(btf, root)?;
    let mut container_name = format!("struct {root}");
    let mut bits = 0u32;
    for (i, step) in path.iter().enumerate() {
        let (member_bits, member) = find_member(btf, &container, step, 0)?
            .ok_or_else(|| anyhow!("kernel BTF: {container_name} has no member {step}"))?;
        if member.bitfield_size().is_some_and(|size| size != 0) || member_bits % 8 != 0 {
            bail!(
                "kernel BTF: {container_name}.{step} is a bitfield; tap-probe cannot read it \
                 with a byte offset"
            );
        }
        bits = bits
            .checked_add(member_bits)
            .ok_or_else(|| anyhow!("kernel BTF: offset of {root}.{} overflows", path.join(".")))?;
        if i + 1 < path.len() {
            let ty = strip_modifiers(btf, btf.resolve_chained_type(&member)?)?;
            container = match ty {
                Type::Struct(s) | Type::Union(s) => s,
                other => bail!(
                    "kernel BTF: {container_name}.{step} is a {}, not a struct or union",
                    other.name()
                ),
            };
            container_name = format!("{container_name}.{step}");
        }
    }
    Ok(bits / 8)
}

/// Whether `struct root` has a byte-aligned member `member` (in anonymous members too).
#[must_use]
pub fn has_member(btf: &Btf, root: &str, member: &str) -> bool {
    offset_of(btf, root, &[member]).is_ok()
}

/// Where the kernel reports a kprobe's misses in the information of its perf link
/// (`bpf_link_info.perf_event.kprobe.missed`, Linux 6.7+): its byte offset, `None` before.
#[must_use]
pub fn kprobe_link_missed(btf: &Btf) -> Option<u32> {
    offset_of(btf, "bpf_link_info", &["perf_event", "kprobe", "missed"]).ok()
}

/// Searches `container` for a member called `name`, descending into anonymous struct/union
/// members. Returns the member's bit offset from the start of `container`.
fn find_member(
    btf: &Btf,
    container: &btf_rs::Struct,
    name: &str,
    depth: usize,
) -> Result<Option<(u32, btf_rs::Member)>> {
    if depth > MAX_DEPTH {
        bail!("kernel BTF: anonymous members nested deeper than {MAX_DEPTH}");
    }
    // Named members first: an anonymous member further up must not shadow a direct match.
    for member in &container.members {
        if btf.resolve_name(member).unwrap_or_default() == name {
            return Ok(Some((member.bit_offset(), member.clone())));
        }
    }
    for member in &container.members {
        if !btf.resolve_name(member).unwrap_or_default().is_empty() {
            continue;
        }
        let ty = strip_modifiers(btf, btf.resolve_chained_type(member)?)?;
        if let Type::Struct(inner) | Type::Union(inner) = ty
            && let Some((bits, found)) = find_member(btf, &inner, name, depth + 1)?
        {
            return Ok(Some((member.bit_offset() + bits, found)));
        }
    }
    Ok(None)
}

/// Follows typedef, const, volatile, restrict and type tags down to the underlying type.
fn strip_modifiers(btf: &Btf, mut ty: Type) -> Result<Type> {
    for _ in 0..MAX_DEPTH {
        ty = match &ty {
            Type::Typedef(t) => btf.resolve_chained_type(t)?,
            Type::Const(t) | Type::Volatile(t) | Type::Restrict(t) => {
                btf.resolve_chained_type(t)?
            }
            Type::TypeTag(t) => btf.resolve_chained_type(t)?,
            _ => return Ok(ty),
        };
    }
    bail!("kernel BTF: typedef chain longer than {MAX_DEPTH}")
}

/// All `(name, value)` pairs of `enum name` (32- or 64-bit). Values of signed enums are
/// sign-extended.
fn enum_members(btf: &Btf, name: &str) -> Result<Vec<(String, i128)>> {
    // BTF stores signed values as their bits: sign-extend from the enum's width.
    #[expect(
        clippy::cast_possible_wrap,
        clippy::cast_possible_truncation,
        reason = "reinterpreting the stored bits of a 32- or 64-bit value"
    )]
    let value = |raw: u64, signed: bool, bits: u32| match (signed, bits) {
        (true, 32) => i128::from(raw as u32 as i32),
        (true, _) => i128::from(raw as i64),
        (false, _) => i128::from(raw),
    };
    for ty in btf.resolve_types_by_name(name).unwrap_or_default() {
        match ty {
            Type::Enum(e) => {
                let signed = e.is_signed();
                return e
                    .members
                    .iter()
                    .map(|m| Ok((btf.resolve_name(m)?, value(u64::from(m.val()), signed, 32))))
                    .collect();
            }
            Type::Enum64(e) => {
                let signed = e.is_signed();
                return e
                    .members
                    .iter()
                    .map(|m| Ok((btf.resolve_name(m)?, value(m.val(), signed, 64))))
                    .collect();
            }
            _ => {}
        }
    }
    bail!("kernel BTF has no enum {name}")
}

/// The value of `member` of `enum name`, which must fit a `u32`.
fn enum_value(btf: &Btf, name: &str, member: &str) -> Result<u32> {
    let value = enum_members(btf, name)?
        .into_iter()
        .find_map(|(n, v)| (n == member).then_some(v))
        .ok_or_else(|| anyhow!("kernel BTF: enum {name} has no member {member}"))?;
    u32::try_from(value).map_err(|_| anyhow!("kernel BTF: {member} is {value}, not a u32"))
}

/// A C-like spelling of type `id`, for display (`struct sk_buff *`, `const void *`, `int`).
fn type_to_string(btf: &Btf, id: u32, depth: usize) -> String {
    if depth > MAX_DEPTH {
        return "...".to_owned();
    }
    let Ok(ty) = btf.resolve_type_by_id(id) else {
        return format!("<type {id}>");
    };
    let named = |t: &dyn BtfType| btf.resolve_name(t).unwrap_or_default();
    let chained = |t: &dyn BtfType| type_to_string(btf, t.get_type_id().unwrap_or(0), depth + 1);
    match &ty {
        Type::Void => "void".to_owned(),
        Type::Int(t) => named(t),
        Type::Float(t) => named(t),
        Type::Typedef(t) => named(t),
        Type::Struct(t) => tagged("struct", &named(t)),
        Type::Union(t) => tagged("union", &named(t)),
        Type::Enum(t) => tagged("enum", &named(t)),
        Type::Enum64(t) => tagged("enum", &named(t)),
        Type::Fwd(t) => tagged(if t.is_union() { "union" } else { "struct" }, &named(t)),
        Type::Ptr(t) => {
            let inner = chained(t);
            if inner.ends_with('*') {
                format!("{inner}*")
            } else {
                format!("{inner} *")
            }
        }
        Type::Const(t) => format!("const {}", chained(t)),
        Type::Volatile(t) => format!("volatile {}", chained(t)),
        Type::Restrict(t) => format!("{} restrict", chained(t)),
        Type::TypeTag(t) => chained(t),
        Type::Array(t) => format!("{}[{}]", chained(t), t.len()),
        Type::FuncProto(p) => {
            let args: Vec<String> = p
                .parameters
                .iter()
                .map(|a| {
                    if a.is_variadic() {
                        "...".to_owned()
                    } else {
                        type_to_string(btf, a.get_type_id().unwrap_or(0), depth + 1)
                    }
                })
                .collect();
            format!(
                "{} (*)({})",
                type_to_string(btf, p.return_type_id(), depth + 1),
                args.join(", ")
            )
        }
        other => other.name().to_owned(),
    }
}

fn tagged(kind: &str, name: &str) -> String {
    if name.is_empty() {
        format!("{kind} <anon>")
    } else {
        format!("{kind} {name}")
    }
}

/// These read the running kernel's BTF: their outcome depends on the kernel, so the guests
/// run them too (`cargo xtask vm` picks `kernel_tests` modules out of the unit tests).
#[cfg(test)]
mod kernel_tests {
    use tap_probe_verdict::Skip;

    use super::*;

    /// The host's BTF, or `None` (after saying why) when this machine has none readable.
    fn host_btf() -> Option<Btf> {
        match load_vmlinux() {
            Ok(btf) => Some(btf),
            Err(err) => {
                Skip::test(format!("{err:#}")).print();
                None
            }
        }
    }

    #[test]
    fn kernel_facts_are_sane() {
        let Some(btf) = host_btf() else { return };
        let facts = kernel_facts(&btf).unwrap();
        eprintln!(
            "skb_dev {} queue_mapping {} ifindex {} dev_net {} net_inum {} dev_tx {} txq_size {} txq_state {} txq_dev {} full_ring {} tx_busy {} drv_xoff_mask {}",
            facts.skb_dev,
            facts.skb_queue_mapping,
            facts.dev_ifindex,
            facts.dev_net,
            facts.net_inum,
            facts.dev_tx,
            facts.txq_size,
            facts.txq_state,
            facts.txq_dev,
            facts.reason_full_ring,
            facts.tx_busy,
            facts.drv_xoff_mask
        );
        assert!(facts.txq_size > 0);
        assert!(facts.txq_state < facts.txq_size);
        assert!(facts.txq_dev < facts.txq_size);
        assert!(facts.drv_xoff_mask.is_power_of_two());
        assert_eq!(facts.reader_range_count, 0);
        // `next` and `prev` come first in every sk_buff layout since the rbnode union.
        assert!(facts.skb_dev >= 16);
        assert_eq!(facts.skb_dev % 8, 0, "a pointer is 8-aligned");
        assert_eq!(facts.skb_destructor % 8, 0, "a pointer is 8-aligned");
        assert_eq!(facts.dev_net % 8, 0, "a pointer is 8-aligned");
        assert_eq!(facts.skb_queue_mapping % 2, 0, "a __u16 is 2-aligned");
        assert_eq!(facts.dev_ifindex % 4, 0);
        assert_eq!(facts.net_inum % 4, 0);
        assert!(facts.tx_busy != 0);
        match DropClass::from_u32(facts.drop_class) {
            Some(DropClass::Reason) => assert!(facts.reason_full_ring != 0),
            Some(DropClass::Path) => assert_eq!(facts.reason_full_ring, 0),
            None => panic!("drop_class {}", facts.drop_class),
        }
    }

    #[test]
    fn ring_facts_are_found() {
        let Some(btf) = host_btf() else { return };
        let (ring, from) = match ring_facts(&btf) {
            Ok(found) => found,
            Err(err) => {
                Skip::test(format!("{err:#}")).print();
                return;
            }
        };
        eprintln!("{ring:?} from {from}");
        assert_eq!(ring.known, 1);
        // netdev_priv() is cacheline aligned past the net_device.
        assert_eq!(ring.dev_priv % 32, 0);
        assert!(ring.dev_priv > 1000, "struct net_device is large");
        assert_eq!(ring.tun_dev % 8, 0, "a pointer");
        assert!(ring.tfile_tx_ring > 0);
        // The span holds all four fields: producer first, the queue pointer last.
        for field in [ring.producer, ring.consumer_head, ring.size, ring.queue] {
            assert!(field + 4 <= ring.span_len, "{field} in {}", ring.span_len);
        }
        assert_eq!(ring.queue + 8, ring.span_len);
    }

    #[test]
    fn full_ring_is_named() {
        let Some(btf) = host_btf() else { return };
        let names = drop_reason_names(&btf);
        let facts = kernel_facts(&btf).unwrap();
        if facts.drop_class == DropClass::Path as u32 {
            // Before 5.17 there is no enum; from 5.17 until tun gave FULL_RING, no such name.
            assert!(!names.values().any(|n| n == "full_ring"), "{names:?}");
            Skip::test("this kernel has no drop reason FULL_RING").print();
            return;
        }
        assert_eq!(
            names.get(&facts.reason_full_ring).map(String::as_str),
            Some("full_ring")
        );
        // Values move between kernels (6.1 has no SKB_CONSUMED), names do not.
        assert!(names.values().any(|n| n == "not_specified"));
    }

    #[test]
    fn tracepoint_arguments() {
        let Some(btf) = host_btf() else { return };
        let args = tracepoint_args(&btf, "kfree_skb").unwrap();
        eprintln!("kfree_skb: {args:?}");
        assert_eq!(args[0], ("skb".to_owned(), "struct sk_buff *".to_owned()));
        // The reason argument came with the drop reasons (5.17); FULL_RING with tun's.
        let reason = args
            .iter()
            .any(|(name, ty)| name == "reason" && ty == "enum skb_drop_reason");
        if full_ring_reason(&btf).is_some() {
            assert!(reason, "{args:?}");
        }
        let args = tracepoint_args(&btf, "net_dev_xmit").unwrap();
        eprintln!("net_dev_xmit: {args:?}");
        assert!(args.iter().any(|(name, _)| name == "rc"));
        let args = tracepoint_args(&btf, "consume_skb").unwrap();
        eprintln!("consume_skb: {args:?}");
        assert_eq!(args[0].0, "skb");
        assert!(tracepoint_args(&btf, "no_such_tracepoint_here").is_err());
    }

    #[test]
    fn missing_names_are_reported() {
        let Some(btf) = host_btf() else { return };
        let err = offset_of(&btf, "sk_buff", &["no_such_member"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("struct sk_buff has no member no_such_member"),
            "{err}"
        );
        let err = offset_of(&btf, "no_such_struct_here", &["x"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no struct no_such_struct_here"), "{err}");
        let err = offset_of(&btf, "sk_buff", &["pkt_type"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("struct sk_buff.pkt_type is a bitfield"),
            "{err}"
        );
        let err = enum_value(&btf, "netdev_tx", "NOPE")
            .unwrap_err()
            .to_string();
        assert!(err.contains("enum netdev_tx has no member NOPE"), "{err}");
    }
}
