//! Attach trials: load, attach, detach and unload one minimal program per attach type.

use std::fmt::Write as _;

use anyhow::Result;
use aya::programs::{BtfTracePoint, FEntry, KProbe, Program, RawTracePoint, TracePoint};

use tap_probe_observer::bpf::object::Object;

use super::{AttachKind, Check, CheckStatus, Trial};

/// Runs every attach trial, or skips them all when the object is empty (`AYA_BUILD_SKIP`).
pub(super) fn attach_trials(object: &[u8]) -> (Check, Vec<Trial>) {
    if object.is_empty() {
        let why = "eBPF object not built (AYA_BUILD_SKIP); attach trials skipped";
        let trials = AttachKind::ALL
            .iter()
            .map(|&kind| Trial {
                kind,
                program: kind.program(),
                target: kind.target(),
                status: CheckStatus::Skipped,
                stage: None,
                error: Some(why.to_owned()),
            })
            .collect();
        let check = Check {
            status: CheckStatus::Skipped,
            detail: why.to_owned(),
        };
        return (check, trials);
    }
    let trials = AttachKind::ALL
        .iter()
        .map(|&kind| trial(kind, object))
        .collect();
    (Check::ok(format!("{} bytes", object.len())), trials)
}

/// The trials' object; a seam so the skipped path is what an `AYA_BUILD_SKIP` build shows.
pub(super) fn doctor_object() -> &'static [u8] {
    Object::Doctor.bytes()
}

/// An error and its sources on one string, skipping a source its parent already quotes
/// (aya's `LoadError` prints its `io::Error` and also returns it as the source).
fn error_text(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            let _ = write!(text, ": {cause_text}");
        }
        source = cause.source();
    }
    // aya appends the verifier log even when the kernel wrote none.
    text.trim_end()
        .trim_end_matches(" Verifier output:")
        .to_owned()
}

/// Loads the object, then loads and attaches `kind`'s program, then detaches and unloads it.
fn trial(kind: AttachKind, object: &[u8]) -> Trial {
    let outcome = try_trial(kind, object);
    let (status, stage, error) = match outcome {
        Ok(()) => (CheckStatus::Ok, None, None),
        Err((stage, error)) => (CheckStatus::Failed, Some(stage), Some(error)),
    };
    Trial {
        kind,
        program: kind.program(),
        target: kind.target(),
        status,
        stage,
        error,
    }
}

type TrialError = (&'static str, String);

fn try_trial(kind: AttachKind, object: &[u8]) -> Result<(), TrialError> {
    let object_err = |e: &(dyn std::error::Error + 'static)| ("object", error_text(e));
    let load_err = |e: aya::programs::ProgramError| ("load", error_text(&e));
    let attach_err = |e: aya::programs::ProgramError| ("attach", error_text(&e));

    let mut ebpf = aya::Ebpf::load(object).map_err(|e| object_err(&e))?;
    let program: &mut Program = ebpf.program_mut(kind.program()).ok_or_else(|| {
        (
            "object",
            format!("the eBPF object has no program {}", kind.program()),
        )
    })?;
    let sys_btf = || aya::Btf::from_sys_fs().map_err(|e| ("load", error_text(&e)));
    match kind {
        AttachKind::RawTp => {
            let p: &mut RawTracePoint = program.try_into().map_err(load_err)?;
            p.load().map_err(load_err)?;
            let link = p.attach(kind.target()).map_err(attach_err)?;
            p.detach(link).map_err(attach_err)?;
            p.unload().map_err(load_err)
        }
        AttachKind::TpBtf => {
            let btf = sys_btf()?;
            let p: &mut BtfTracePoint = program.try_into().map_err(load_err)?;
            p.load(kind.target(), &btf).map_err(load_err)?;
            let link = p.attach().map_err(attach_err)?;
            p.detach(link).map_err(attach_err)?;
            p.unload().map_err(load_err)
        }
        AttachKind::Tracepoint => {
            let p: &mut TracePoint = program.try_into().map_err(load_err)?;
            p.load().map_err(load_err)?;
            let link = p.attach("net", "net_dev_xmit").map_err(attach_err)?;
            p.detach(link).map_err(attach_err)?;
            p.unload().map_err(load_err)
        }
        AttachKind::Kprobe => {
            let p: &mut KProbe = program.try_into().map_err(load_err)?;
            p.load().map_err(load_err)?;
            let link = p.attach(kind.target(), 0).map_err(attach_err)?;
            p.detach(link).map_err(attach_err)?;
            p.unload().map_err(load_err)
        }
        AttachKind::Fentry => {
            let btf = sys_btf()?;
            let p: &mut FEntry = program.try_into().map_err(load_err)?;
            p.load(kind.target(), &btf).map_err(load_err)?;
            let link = p.attach().map_err(attach_err)?;
            p.detach(link).map_err(attach_err)?;
            p.unload().map_err(load_err)
        }
    }
}
