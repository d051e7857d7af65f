//! The program, installed in a forked child that makes each call and reports its result: every
//! rule is checked against the kernel, not against the BPF text.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

/// One probe: the raw syscall and its arguments.
type Call = (i64, [u64; 5]);

const SOCK: i64 = libc::SYS_socket;
const INET: u64 = libc::AF_INET as u64;
const STREAM: u64 = libc::SOCK_STREAM as u64;
const MPTCP: u64 = 262;
/// Not a syscall number: the probe that makes an i386 `getpid` through `int 0x80`.
const I386_GETPID: i64 = -1000;

/// `getpid` through the i386 entry point (x86_64 with IA32 emulation).
#[cfg(target_arch = "x86_64")]
fn int80_getpid() -> libc::c_long {
    let mut ax: i64 = 20;
    // SAFETY: the i386 getpid takes no arguments and touches no memory; r8-r11 may be clobbered
    // by older kernels' compat entry.
    unsafe {
        std::arch::asm!("int 0x80", inout("rax") ax, out("r8") _, out("r9") _, out("r10") _,
                        out("r11") _, options(nostack));
    }
    if ax < 0 {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = -ax as i32 };
        return -1;
    }
    ax
}

#[cfg(not(target_arch = "x86_64"))]
fn int80_getpid() -> libc::c_long {
    -1
}

/// Runs `calls` in a child under `prog`; each result as `Ok(return value)` or `Err(errno)`.
/// `None` when the child died by a signal (the signal number is the second value).
fn run_filtered(prog: &[libc::sock_filter], calls: &[Call]) -> (Option<Vec<i64>>, i32) {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) into a local array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only makes raw syscalls on data prepared before the fork, then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: in the forked child.
        unsafe {
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            let fprog = libc::sock_fprog {
                len: prog.len() as libc::c_ushort,
                filter: prog.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                &fprog as *const libc::sock_fprog,
            ) != 0
            {
                libc::_exit(90);
            }
            for (nr, a) in calls {
                let rc = if *nr == I386_GETPID {
                    int80_getpid()
                } else {
                    libc::syscall(*nr, a[0], a[1], a[2], a[3], a[4])
                };
                let v: i64 = if rc < 0 {
                    -i64::from(*libc::__errno_location())
                } else {
                    if *nr == libc::SYS_clone && rc == 0 {
                        libc::_exit(0);
                    }
                    0
                };
                libc::write(fds[1], (&v as *const i64).cast(), 8);
            }
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(fds[1]) };
    let mut out = Vec::new();
    let mut buf = [0u8; 8];
    // SAFETY: reading into a local buffer from our pipe.
    while unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), 8) } == 8 {
        out.push(i64::from_ne_bytes(buf));
    }
    // SAFETY: closing our read end.
    unsafe { libc::close(fds[0]) };
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFSIGNALED(status) {
        return (None, libc::WTERMSIG(status));
    }
    assert_eq!(libc::WEXITSTATUS(status), 0, "filter not installed");
    (Some(out), 0)
}

fn results(network: &NetworkAccess, calls: &[Call]) -> Vec<i64> {
    let prog = program(network, false).unwrap();
    run_filtered(&prog, calls).0.expect("child killed")
}

fn eperm() -> i64 {
    -i64::from(libc::EPERM)
}

#[test]
fn inet_streams_only_with_tcp_where_the_agent_has_network() {
    let calls = [
        (SOCK, [INET, STREAM, 0, 0, 0]),
        (SOCK, [INET, STREAM, libc::IPPROTO_TCP as u64, 0, 0]),
        (
            SOCK,
            [INET, STREAM | libc::SOCK_CLOEXEC as u64, MPTCP, 0, 0],
        ),
        (SOCK, [libc::AF_INET6 as u64, STREAM, MPTCP, 0, 0]),
        (SOCK, [INET, STREAM, libc::IPPROTO_SCTP as u64, 0, 0]),
        (SOCK, [INET, libc::SOCK_DGRAM as u64, 0, 0, 0]),
        (SOCK, [libc::AF_UNIX as u64, STREAM, 0, 0, 0]),
    ];
    let r = results(&NetworkAccess::Allowlist(vec!["x.test".into()]), &calls);
    assert_eq!(r[..2], [0, 0], "plain TCP must still work: {r:?}");
    assert!(r[2..].iter().all(|&v| v == eperm()), "{r:?}");
    // No network: no socket at all, TCP included.
    let r = results(&NetworkAccess::None, &calls);
    assert!(r.iter().all(|&v| v == eperm()), "{r:?}");
}

#[test]
fn clone_with_a_namespace_flag_is_refused_and_clone3_is_enosys() {
    let sigchld = libc::SIGCHLD as u64;
    let calls: Vec<Call> = NAMESPACE_FLAGS
        .iter()
        .map(|&f| (libc::SYS_clone, [f | sigchld, 0, 0, 0, 0]))
        .chain([
            (libc::SYS_clone, [sigchld, 0, 0, 0, 0]),
            (libc::SYS_clone3, [0, 0, 0, 0, 0]),
            (libc::SYS_unshare, [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0]),
        ])
        .collect();
    let r = results(&NetworkAccess::None, &calls);
    let n = NAMESPACE_FLAGS.len();
    assert!(r[..n].iter().all(|&v| v == eperm()), "{r:?}");
    assert_eq!(r[n], 0, "a plain fork must work: {r:?}");
    assert_eq!(r[n + 1], -i64::from(libc::ENOSYS), "{r:?}");
    assert_eq!(r[n + 2], eperm(), "{r:?}");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn x32_numbers_are_refused_and_foreign_calls_kill() {
    // getpid through the x32 numbering: EPERM from the filter (without it, a kernel with x32
    // support would run it; one without says ENOSYS, never EPERM).
    let r = results(&NetworkAccess::None, &[(X32_BIT as i64 | 39, [0; 5])]);
    assert_eq!(r, [eperm()]);
    // An i386 call (`int 0x80`, getpid is 20 there) from the 64-bit process: killed, since no
    // rule would match its numbering. The control: without the filter it returns the pid.
    let (out, _) = run_filtered(
        &[stmt(RET, libc::SECCOMP_RET_ALLOW)],
        &[(I386_GETPID, [0; 5])],
    );
    if out != Some(vec![0]) {
        assert!(
            std::env::var_os("CI").is_none(),
            "int 0x80 does not work here at all ({out:?}): no IA32 emulation?"
        );
        eprintln!("skipping the i386 check: int 0x80 fails without a filter ({out:?})");
        return;
    }
    let prog = program(&NetworkAccess::None, false).unwrap();
    let (out, sig) = run_filtered(&prog, &[(I386_GETPID, [0; 5])]);
    assert_eq!((out, sig), (None, libc::SIGSYS));
}

/// A classic BPF interpreter for what the program uses, over a `seccomp_data` for this build's
/// architecture: the action, and how many instructions ran.
fn eval(prog: &[libc::sock_filter], nr: u32, args: [u64; 6]) -> (u32, usize) {
    let word = |off: u32| -> u32 {
        match off {
            0 => nr,
            4 => AUDIT_ARCH,
            16..=63 => {
                let a = args[((off - 16) / 8) as usize];
                if off.is_multiple_of(8) {
                    a as u32
                } else {
                    (a >> 32) as u32
                }
            }
            _ => panic!("load at {off}"),
        }
    };
    let (mut pc, mut acc, mut ran) = (0usize, 0u32, 0usize);
    loop {
        let i = prog[pc];
        ran += 1;
        let code = u32::from(i.code);
        let taken = |c: bool| {
            if c {
                usize::from(i.jt)
            } else {
                usize::from(i.jf)
            }
        };
        pc += 1;
        match code {
            c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => acc = word(i.k),
            c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => acc &= i.k,
            c if c == libc::BPF_JMP | libc::BPF_JA => pc += i.k as usize,
            c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => pc += taken(acc == i.k),
            c if c == libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K => pc += taken(acc > i.k),
            c if c == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => pc += taken(acc >= i.k),
            c if c == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K => pc += taken(acc & i.k != 0),
            c if c == libc::BPF_RET | libc::BPF_K => return (i.k, ran),
            other => panic!("opcode {other:#x} at {}", pc - 1),
        }
    }
}

/// The binary search in front of seccompiler's chain changes no decision, for every syscall
/// number and the arguments the rules look at; and a number without rules is decided within a
/// few instructions (what installing the filter costs, see `dispatch`), where the chain alone
/// took dozens.
#[test]
fn the_dispatch_tree_decides_as_the_chain_and_quickly() {
    let arg_sets: Vec<[u64; 6]> = vec![
        [0; 6],
        [INET, STREAM, 0, 0, 0, 0],
        [INET, STREAM, MPTCP, 0, 0, 0],
        [libc::AF_UNIX as u64, libc::SOCK_DGRAM as u64, 0, 0, 0, 0],
        [libc::AF_INET6 as u64, libc::SOCK_RAW as u64, 0, 0, 0, 0],
        [
            libc::CLONE_NEWUSER as u64 | libc::SIGCHLD as u64,
            0,
            0,
            0,
            0,
            0,
        ],
        [libc::SIGCHLD as u64, 0, 0, 0, 0, 0],
    ];
    for network in [
        NetworkAccess::None,
        NetworkAccess::Allowlist(vec!["x.test".into()]),
        NetworkAccess::Unrestricted,
    ] {
        for new_sessions in [false, true] {
            let fast = program(&network, new_sessions).unwrap();
            let rules = rules(&network, new_sessions).unwrap();
            let ruled: Vec<i64> = rules.keys().copied().collect();
            let mut chain = prologue().unwrap();
            chain.extend(compile(rules).unwrap());
            let mut worst_fast = 0;
            let mut worst_chain = 0;
            for nr in 0..=600u32 {
                for args in &arg_sets {
                    let (a, ran) = eval(&fast, nr, *args);
                    let (b, ran_chain) = eval(&chain, nr, *args);
                    assert_eq!(a, b, "syscall {nr} {args:?} ({network:?}, {new_sessions})");
                    if !ruled.contains(&i64::from(nr)) {
                        worst_fast = worst_fast.max(ran);
                        worst_chain = worst_chain.max(ran_chain);
                    }
                }
            }
            assert!(
                worst_fast <= 16,
                "{worst_fast} instructions for a number without rules"
            );
            assert!(
                worst_chain > 2 * worst_fast,
                "{worst_chain} vs {worst_fast}"
            );
        }
    }
}
