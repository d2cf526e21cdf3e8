//! The cell's seccomp filter: everything is allowed except what code in a cell never needs,
//! which fails with `EPERM` — tracing other processes, mounting, BPF, keyrings, perf, kernel
//! modules, new namespaces, io_uring, and raw, netlink or vsock sockets. `clone3` fails with `ENOSYS`, so the C
//! library falls back to `clone`, whose namespace flags the filter can see.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

const DENIED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_bpf,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_perf_event_open,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_kexec_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_open_by_handle_at,
    libc::SYS_userfaultfd,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    // io_uring performs I/O the filter never sees (its operations are not system calls).
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| e.to_string())
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conditions).map_err(|e| e.to_string())
}

/// The filters as BPF programs in the byte layout `bwrap --add-seccomp-fd` reads.
pub fn program() -> Result<Vec<Vec<u8>>, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for sys in DENIED {
        rules.insert(*sys, Vec::new());
    }
    // A clone that asks for any new namespace.
    let namespaces = [
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWNS,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWCGROUP,
    ];
    let mut clone_rules = Vec::new();
    for flag in namespaces {
        let flag = flag as u64;
        clone_rules.push(rule(vec![cond(0, SeccompCmpOp::MaskedEq(flag), flag)?])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    // Raw sockets and netlink.
    rules.insert(
        libc::SYS_socket,
        vec![
            rule(vec![cond(0, SeccompCmpOp::Eq, libc::AF_NETLINK as u64)?])?,
            rule(vec![cond(0, SeccompCmpOp::Eq, libc::AF_PACKET as u64)?])?,
            // Host/guest sockets reach the hypervisor, outside every network namespace.
            rule(vec![cond(0, SeccompCmpOp::Eq, libc::AF_VSOCK as u64)?])?,
            rule(vec![cond(
                1,
                SeccompCmpOp::MaskedEq(0xf),
                libc::SOCK_RAW as u64,
            )?])?,
        ],
    );
    let denied = compile(rules, libc::EPERM)?;
    // `clone3` passes its flags in memory the filter cannot read: make it look absent, so the C
    // library falls back to `clone`.
    let mut clone3 = BTreeMap::new();
    clone3.insert(libc::SYS_clone3, Vec::new());
    let absent = compile(clone3, libc::ENOSYS)?;
    Ok(vec![denied, absent])
}

fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<Vec<u8>, String> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| format!("no seccomp filter for this architecture: {e:?}"))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(|e| format!("building the seccomp filter: {e}"))?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e| format!("compiling the seccomp filter: {e:?}"))?;
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for ins in program {
        bytes.extend_from_slice(&ins.code.to_ne_bytes());
        bytes.push(ins.jt);
        bytes.push(ins.jf);
        bytes.extend_from_slice(&ins.k.to_ne_bytes());
    }
    Ok(bytes)
}
