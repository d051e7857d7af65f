//! The seccomp program every native agent and confined CLI runs under: which sockets it may make,
//! which process and namespace operations it may use, and which calling conventions it may use at
//! all. Built once in the parent as classic BPF (installed by the child between fork and exec).
//!
//! The program starts with a prologue of its own, before the per-syscall rules (compiled by
//! `seccompiler`, whose single "match" action is `EPERM`):
//!
//! 1. the calling convention: a syscall from any architecture but this build's (an `int 0x80`
//!    i386 call on x86_64) kills the process, since a 32-bit call has other numbers that no rule
//!    below would match;
//! 2. on x86_64, a number with the x32 bit (`0x40000000`) is refused with `EPERM`: x32 calls share
//!    the x86_64 architecture value, so the rules (which name x86_64 numbers) would not see them;
//! 3. `clone3` is refused with `ENOSYS`: its flags live in memory a filter cannot read, and libc
//!    falls back to `clone` on `ENOSYS`, whose flags the rules below check.

use std::collections::BTreeMap;

use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

use crate::error::{Result, RuntimeError};
use crate::spec::NetworkAccess;

fn setup(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::SandboxSetup(msg.into())
}

/// The seccomp program: the prologue above, then EPERM for sockets the network mode does not allow
/// (never a Unix-domain socket; Unix socket pairs only as connected streams or seqpackets; with a
/// network grant, inet streams with protocol 0 or TCP only), for leaving the process group or
/// session unless `new_sessions` (so killing the group reaches every descendant; allowed only
/// where a cgroup holds the whole tree and is killed as one), for `clone` with any namespace flag,
/// and for the syscalls no agent needs (ptrace, mounts, namespaces, kernel keyring, bpf...).
///
/// # Errors
/// [`RuntimeError::SandboxSetup`] when the filter cannot be compiled for this architecture.
pub fn program(network: &NetworkAccess, new_sessions: bool) -> Result<Vec<libc::sock_filter>> {
    let mut rules = rules(network, new_sessions)?;
    let nr = |k: &i64| u32::try_from(*k).ok();
    let denied: Vec<u32> = rules
        .iter()
        .filter(|(_, r)| r.is_empty())
        .filter_map(|(k, _)| nr(k))
        .collect();
    rules.retain(|_, r| !r.is_empty());
    let ruled: Vec<u32> = rules.keys().filter_map(nr).collect();
    let mut prog = prologue()?;
    prog.extend(dispatch(&denied, &ruled)?);
    prog.extend(compile(rules)?);
    Ok(prog)
}

/// The per-syscall rules (see [`program`]): an empty list refuses the call outright.
fn rules(network: &NetworkAccess, new_sessions: bool) -> Result<BTreeMap<i64, Vec<SeccompRule>>> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(libc::SYS_socketpair, socketpair_rules()?);
    rules.insert(libc::SYS_socket, socket_rules(network)?);
    rules.insert(libc::SYS_clone, clone_rules()?);
    if !new_sessions {
        rules.insert(libc::SYS_setsid, vec![]);
        rules.insert(libc::SYS_setpgid, vec![]);
    }
    for &nr in DENIED_SYSCALLS {
        rules.insert(nr, vec![]);
    }
    Ok(rules)
}

/// Where a dispatch instruction jumps: a number of instructions ahead, or one of the three
/// endings after the tree: `ALLOW`, `EPERM`, the rules' chain.
#[derive(Clone, Copy)]
enum Target {
    Ahead(usize),
    Allow,
    Deny,
    Rules,
}

/// A binary search over the syscall numbers that are refused outright or have rules (the number
/// is in the accumulator): any other number is allowed, and a refused one refused, after a
/// handful of comparisons; only the few numbers whose arguments decide go through seccompiler's
/// chain. Why it matters: when a filter is installed the kernel runs it once per syscall number
/// to find those it always allows, and compiles it, so installing it costs in proportion to the
/// instructions each number passes and to its length. seccompiler's chain alone (every rule
/// tested one after another) made installing the filter about a tenth of a sandboxed spawn.
fn dispatch(denied: &[u32], ruled: &[u32]) -> Result<Vec<libc::sock_filter>> {
    fn tree(nrs: &[(u32, Target)], out: &mut Vec<(u16, u32, Target, Target)>) {
        match nrs {
            [] => out.push((JA, 0, Target::Allow, Target::Allow)),
            [(nr, to)] => out.push((JEQ, *nr, *to, Target::Allow)),
            _ => {
                let (low, high) = nrs.split_at(nrs.len() / 2);
                let at = out.len();
                out.push((JGE, high[0].0, Target::Ahead(0), Target::Ahead(0)));
                tree(low, out);
                let low_len = out.len() - at - 1;
                out[at].2 = Target::Ahead(low_len);
                tree(high, out);
            }
        }
    }
    let mut sorted: Vec<(u32, Target)> = denied
        .iter()
        .map(|&nr| (nr, Target::Deny))
        .chain(ruled.iter().map(|&nr| (nr, Target::Rules)))
        .collect();
    sorted.sort_unstable_by_key(|&(nr, _)| nr);
    sorted.dedup_by_key(|&mut (nr, _)| nr);
    let mut code = Vec::new();
    tree(&sorted, &mut code);
    let allow = code.len();
    let offset = |pc: usize, t: Target| -> Result<u8> {
        let to = match t {
            Target::Ahead(n) => pc + 1 + n,
            Target::Allow => allow,
            Target::Deny => allow + 1,
            Target::Rules => allow + 2,
        };
        u8::try_from(to - pc - 1)
            .map_err(|_| setup("seccomp: too many syscalls with rules for one jump"))
    };
    let mut prog = Vec::with_capacity(code.len() + 2);
    for (pc, &(op, k, jt, jf)) in code.iter().enumerate() {
        prog.push(if op == JA {
            stmt(JA, u32::from(offset(pc, jt)?))
        } else {
            jump(op, k, offset(pc, jt)?, offset(pc, jf)?)
        });
    }
    prog.push(stmt(RET, libc::SECCOMP_RET_ALLOW));
    prog.push(stmt(RET, errno(libc::EPERM)));
    Ok(prog)
}

/// Refused outright (EPERM): tracing and reading other processes, mounts (the old and the new
/// mount API) and namespaces, kernel keyrings, BPF, perf, module and kexec loading, io_uring
/// (which bypasses seccomp per call).
const DENIED_SYSCALLS: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_bpf,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_perf_event_open,
    libc::SYS_kexec_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_io_uring_setup,
];

/// Every namespace flag `clone` takes. `CLONE_NEWTIME` shares its bit with the exit signal's byte
/// in `clone` (only `clone3` and `unshare` take it), where no valid signal sets it: refusing it
/// costs nothing.
const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

const IPPROTO_TCP: u64 = libc::IPPROTO_TCP as u64;
/// `seccomp_data` offsets: the syscall number, then the architecture.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
/// The x32 ABI's bit in a syscall number (`__X32_SYSCALL_BIT`).
#[cfg(target_arch = "x86_64")]
const X32_BIT: u32 = 0x4000_0000;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64
#[cfg(target_arch = "riscv64")]
const AUDIT_ARCH: u32 = 0xc000_00f3; // AUDIT_ARCH_RISCV64

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

const LD_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

fn errno(e: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA)
}

/// The architecture check, the x32 refusal and `clone3` (see the module's comment).
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
fn prologue() -> Result<Vec<libc::sock_filter>> {
    let mut p = vec![
        stmt(LD_ABS, DATA_ARCH),
        jump(JEQ, AUDIT_ARCH, 1, 0),
        stmt(RET, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(LD_ABS, DATA_NR),
    ];
    #[cfg(target_arch = "x86_64")]
    p.extend([jump(JGE, X32_BIT, 0, 1), stmt(RET, errno(libc::EPERM))]);
    p.extend([
        jump(JEQ, libc::SYS_clone3 as u32, 0, 1),
        stmt(RET, errno(libc::ENOSYS)),
    ]);
    Ok(p)
}

#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
fn prologue() -> Result<Vec<libc::sock_filter>> {
    Err(setup(format!(
        "seccomp: no architecture check for {}",
        std::env::consts::ARCH
    )))
}

fn seccomp_err(e: seccompiler::BackendError) -> RuntimeError {
    setup(format!("seccomp: {e}"))
}

fn cond(arg: u8, op: SeccompCmpOp, v: u64) -> Result<SeccompCondition> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, v).map_err(seccomp_err)
}

/// A rule matching when argument `arg` compares with `v` by `op`.
fn arg_is(arg: u8, op: SeccompCmpOp, v: u64) -> Result<SeccompRule> {
    SeccompRule::new(vec![cond(arg, op, v)?]).map_err(seccomp_err)
}

/// A rule matching a socket type (the low byte of `type`, past the flags).
fn type_is(ty: i32) -> Result<SeccompRule> {
    arg_is(1, SeccompCmpOp::MaskedEq(0xff), ty as u64)
}

/// No Unix-domain socket() in any mode: Landlock (ABI <= 7) does not check connect() to a
/// pathname socket, so a container engine's or the session bus's socket would be one connect
/// away. Abstract sockets are scoped by Landlock (ABI >= 6) as well. With a network grant: TCP
/// streams over inet/inet6 only, with protocol 0 or `IPPROTO_TCP` (Landlock confines TCP connects
/// to the proxy port, and only TCP: an `IPPROTO_MPTCP` or SCTP stream would connect anywhere);
/// unrestricted: anything but raw sockets.
fn socket_rules(network: &NetworkAccess) -> Result<Vec<SeccompRule>> {
    let not_inet = || -> Result<SeccompRule> {
        SeccompRule::new(vec![
            cond(0, SeccompCmpOp::Ne, libc::AF_INET as u64)?,
            cond(0, SeccompCmpOp::Ne, libc::AF_INET6 as u64)?,
        ])
        .map_err(seccomp_err)
    };
    Ok(match network {
        NetworkAccess::None => vec![],
        NetworkAccess::Allowlist(_) => vec![
            not_inet()?,
            type_is(libc::SOCK_DGRAM)?,
            type_is(libc::SOCK_RAW)?,
            type_is(libc::SOCK_SEQPACKET)?,
            SeccompRule::new(vec![
                cond(2, SeccompCmpOp::Ne, 0)?,
                cond(2, SeccompCmpOp::Ne, IPPROTO_TCP)?,
            ])
            .map_err(seccomp_err)?,
        ],
        NetworkAccess::Unrestricted => vec![not_inet()?, type_is(libc::SOCK_RAW)?],
    })
}

/// A connected pair of Unix stream or seqpacket sockets is how node/libuv (and others) wire a
/// child's stdio, and how Codex starts its commands (a seqpacket pair): allowed. Neither can reach
/// anything: connect() on it is EISCONN, sendmsg() on a connected stream ignores or refuses an
/// address (a seqpacket socket sends to its peer only), bind() needs Landlock's MAKE_SOCK on the
/// directory. A datagram pair could connect()/sendto() any host datagram socket by path: refused.
/// "type & 0xff not in {SOCK_STREAM, SOCK_SEQPACKET}" is spelled as the other types (seccompiler
/// has no masked `!=`).
fn socketpair_rules() -> Result<Vec<SeccompRule>> {
    let mut rules = vec![arg_is(0, SeccompCmpOp::Ne, libc::AF_UNIX as u64)?];
    for ty in [libc::SOCK_DGRAM, libc::SOCK_RAW, libc::SOCK_RDM] {
        rules.push(type_is(ty)?);
    }
    Ok(rules)
}

/// `clone` with any namespace flag (argument 0 holds the flags on every architecture metash
/// builds for): one rule per flag, since seccompiler has no masked `!=`.
fn clone_rules() -> Result<Vec<SeccompRule>> {
    NAMESPACE_FLAGS
        .iter()
        .map(|&f| arg_is(0, SeccompCmpOp::MaskedEq(f), f))
        .collect()
}

/// The rules as classic BPF for this architecture: matching rules get EPERM, the rest run.
fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>) -> Result<Vec<libc::sock_filter>> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| setup(format!("seccomp arch: {e}")))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(seccomp_err)?;
    let prog: seccompiler::BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| setup(format!("seccomp compile: {e}")))?;
    Ok(prog
        .into_iter()
        .map(|f| libc::sock_filter {
            code: f.code,
            jt: f.jt,
            jf: f.jf,
            k: f.k,
        })
        .collect())
}

#[cfg(test)]
#[path = "seccomp_tests.rs"]
mod tests;
