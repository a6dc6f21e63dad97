//! Stores from user space into a file's shared mapping that survive a page
//! going away ([`FileMap::store`]).
//!
//! A store through a `MAP_SHARED` mapping of a tmpfs file raises SIGBUS
//! when its page cannot be had: the file was cut short under the mapping,
//! or a hole could not be filled on a full tmpfs. Left alone, that signal
//! kills the whole target for one bad page. So the copy is one `rep movsb`
//! at a known address, and a SIGBUS handler that finds the faulting
//! instruction there moves execution to the instruction after it: the
//! copy ends early, with the bytes not copied still in `rcx` (a string
//! instruction keeps its registers exact when it faults), which is what
//! the copy returns. This is how the kernel's own user copies recover
//! from faults (exception tables). A SIGBUS anywhere else goes to the
//! handler that was there before (Rust's stack-overflow report, or the
//! default action).
//!
//! Large stores (from [`NT_STORE_MIN`] bytes) go by non-temporal stores
//! (`movntdq`) instead, which write whole cache lines without first
//! reading them in: 40 µs per MiB into a tmpfs file's pages against 54-69
//! for `rep movsb` on this project's machine. Their loop keeps `rcx` equal
//! to the bytes not yet stored at every instruction that can fault (it is
//! only lowered after a 64-byte block's four stores), so the handler
//! recovers a fault anywhere in the loop the same way.
//!
//! Reads from user space ([`FileMap::read_guarded`], a data digest computed
//! over the file's pages in place, `gate.rs`) recover the same way, but the
//! reading code is not one instruction: it is whatever the caller runs
//! (a vectorised CRC). So it runs under a trampoline that saves the
//! callee-saved registers on its stack and the stack pointer in a
//! thread-local record along with the range being read; a SIGBUS whose
//! address lies in that range, on that thread, resumes at the
//! trampoline's recovery label with the stack pointer it saved, as if the
//! call had returned "faulted". The frames skipped are the caller's
//! computation, which must own nothing that needs dropping and take no
//! lock (plain old frames, which may be skipped this way).
//!
//! x86-64 Linux only; elsewhere [`FileMap::store`] stores nothing and the
//! caller writes with `pwrite(2)`, and [`FileMap::read_guarded`] reads
//! nothing.

use crate::FileMap;

/// Stores of at least this many bytes go by non-temporal stores (module
/// docs).
pub const NT_STORE_MIN: usize = 256 * 1024;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use std::sync::{Once, OnceLock};

    // The copy: `rdi` destination, `rsi` source, `rdx` length (System V);
    // returns in `rax` the bytes left uncopied, 0 unless a fault cut it
    // short. The direction flag is clear on entry (System V).
    std::arch::global_asm!(
        ".pushsection .text.ironsan_store_copy,\"ax\",@progbits",
        ".p2align 4",
        ".globl ironsan_store_copy",
        ".type ironsan_store_copy,@function",
        "ironsan_store_copy:",
        "mov rcx, rdx",
        ".globl ironsan_store_copy_insn",
        "ironsan_store_copy_insn:",
        "rep movsb",
        ".globl ironsan_store_copy_fixup",
        "ironsan_store_copy_fixup:",
        "mov rax, rcx",
        "ret",
        ".size ironsan_store_copy, .-ironsan_store_copy",
        ".popsection",
    );

    // The non-temporal copy: `rdi` destination (64-byte aligned), `rsi`
    // source, `rdx` length (a non-zero multiple of 64); returns in `rax`
    // the bytes left unstored. xmm0-3 are caller-saved (System V).
    std::arch::global_asm!(
        ".pushsection .text.ironsan_store_nt,\"ax\",@progbits",
        ".p2align 4",
        ".globl ironsan_store_nt",
        ".type ironsan_store_nt,@function",
        "ironsan_store_nt:",
        "mov rcx, rdx",
        ".globl ironsan_store_nt_loop",
        "ironsan_store_nt_loop:",
        "movdqu xmm0, [rsi]",
        "movdqu xmm1, [rsi + 16]",
        "movdqu xmm2, [rsi + 32]",
        "movdqu xmm3, [rsi + 48]",
        "movntdq [rdi], xmm0",
        "movntdq [rdi + 16], xmm1",
        "movntdq [rdi + 32], xmm2",
        "movntdq [rdi + 48], xmm3",
        "add rsi, 64",
        "add rdi, 64",
        "sub rcx, 64",
        "jnz ironsan_store_nt_loop",
        ".globl ironsan_store_nt_fixup",
        "ironsan_store_nt_fixup:",
        "sfence",
        "mov rax, rcx",
        "ret",
        ".size ironsan_store_nt, .-ironsan_store_nt",
        ".popsection",
    );

    // The guarded call: `rdi` the function, `rsi` its argument, `rdx` where
    // to save the stack pointer the recovery resumes with. Returns 0 when
    // the function returned, 1 when a fault in the armed range cut it
    // short. The callee-saved registers are pushed before the stack
    // pointer is saved, so the recovery restores them by popping.
    std::arch::global_asm!(
        ".pushsection .text.ironsan_guarded_call,\"ax\",@progbits",
        ".p2align 4",
        ".globl ironsan_guarded_call",
        ".type ironsan_guarded_call,@function",
        "ironsan_guarded_call:",
        "push rbp",
        "push rbx",
        "push r12",
        "push r13",
        "push r14",
        "push r15",
        // 8 (return address) + 48 pushed: 8 more keeps the call aligned.
        "sub rsp, 8",
        "mov [rdx], rsp",
        "mov rax, rdi",
        "mov rdi, rsi",
        "call rax",
        "xor eax, eax",
        "2:",
        "add rsp, 8",
        "pop r15",
        "pop r14",
        "pop r13",
        "pop r12",
        "pop rbx",
        "pop rbp",
        "ret",
        ".globl ironsan_guarded_recover",
        "ironsan_guarded_recover:",
        "mov eax, 1",
        "jmp 2b",
        ".size ironsan_guarded_call, .-ironsan_guarded_call",
        ".popsection",
    );

    /// What the handler needs to recover a guarded read on this thread.
    #[repr(C)]
    struct Armed {
        /// The stack pointer the trampoline saved.
        rsp: usize,
        /// The range being read: faults elsewhere are not ours.
        lo: usize,
        hi: usize,
    }

    thread_local! {
        /// The guarded read running on this thread, if any.
        static ARMED: std::cell::Cell<*const Armed> = const { std::cell::Cell::new(std::ptr::null()) };
    }

    extern "C" {
        fn ironsan_guarded_call(
            f: extern "C" fn(*mut libc::c_void),
            arg: *mut libc::c_void,
            rsp_slot: *mut usize,
        ) -> u32;
        static ironsan_guarded_recover: u8;
    }

    extern "C" {
        fn ironsan_store_copy(dst: *mut u8, src: *const u8, len: usize) -> usize;
        fn ironsan_store_nt(dst: *mut u8, src: *const u8, len: usize) -> usize;
        static ironsan_store_nt_loop: u8;
        static ironsan_store_nt_fixup: u8;
        static ironsan_store_copy_insn: u8;
        static ironsan_store_copy_fixup: u8;
    }

    /// The SIGBUS disposition before ours, for faults that are not ours.
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
    static INSTALL: Once = Once::new();

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid ucontext_t to an SA_SIGINFO
        // handler; only its saved rip is read and written, and only the
        // addresses of two symbols are taken. Nothing here allocates or
        // locks (async-signal-safe).
        unsafe {
            let uc = ctx.cast::<libc::ucontext_t>();
            let rip = &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize];
            if *rip as usize == std::ptr::addr_of!(ironsan_store_copy_insn) as usize {
                *rip = std::ptr::addr_of!(ironsan_store_copy_fixup) as i64;
                return;
            }
            let nt = std::ptr::addr_of!(ironsan_store_nt_loop) as usize
                ..std::ptr::addr_of!(ironsan_store_nt_fixup) as usize;
            if nt.contains(&(*rip as usize)) {
                *rip = std::ptr::addr_of!(ironsan_store_nt_fixup) as i64;
                return;
            }
            // A guarded read on this thread, faulting in its range. The
            // thread-local is const-initialised without a destructor: a
            // plain TLS load.
            let armed = ARMED.try_with(|a| a.get()).unwrap_or(std::ptr::null());
            if !armed.is_null() {
                let addr = (*info).si_addr() as usize;
                let a = &*armed;
                if (a.lo..a.hi).contains(&addr) {
                    (*uc).uc_mcontext.gregs[libc::REG_RSP as usize] = a.rsp as i64;
                    *rip = std::ptr::addr_of!(ironsan_guarded_recover) as i64;
                    return;
                }
            }
            match PREVIOUS.get() {
                Some(p)
                    if p.sa_flags & libc::SA_SIGINFO != 0
                        && p.sa_sigaction != libc::SIG_DFL
                        && p.sa_sigaction != libc::SIG_IGN =>
                {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(p.sa_sigaction);
                    f(sig, info, ctx);
                }
                Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(p.sa_sigaction);
                    f(sig);
                }
                // Default (or ignored, which a fault cannot be): restore it
                // and return, so that the fault happens again and ends the
                // process as it would have without us.
                _ => {
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
                }
            }
        }
    }

    /// Installs the handler once per process; false if it could not be.
    pub(super) fn install() -> bool {
        INSTALL.call_once(|| {
            // SAFETY: sigaction(2) with valid pointers; the handler is an
            // `extern "C"` function of the SA_SIGINFO shape, and PREVIOUS
            // is set before the handler can run.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                    return;
                }
                let _ = PREVIOUS.set(old);
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_sigbus as *const () as usize;
                act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut act.sa_mask);
                libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut());
            }
        });
        PREVIOUS.get().is_some()
    }

    /// Runs `f` with faults in `lo .. hi` recovered; false if one cut it
    /// short.
    ///
    /// # Safety
    /// `f` must own nothing that needs dropping and take no lock: when a
    /// fault cuts it short, its frames are skipped (module docs). It must
    /// not panic (the unwind would cross a C frame, which aborts).
    pub(super) unsafe fn guarded(lo: usize, hi: usize, f: &mut dyn FnMut()) -> bool {
        extern "C" fn call(arg: *mut libc::c_void) {
            // SAFETY: `arg` is the `&mut &mut dyn FnMut()` below, alive
            // for the call.
            let f = unsafe { &mut *arg.cast::<&mut dyn FnMut()>() };
            f();
        }
        let mut armed = Armed { rsp: 0, lo, hi };
        let prev = ARMED.with(|a| a.replace(&armed));
        let mut f = f;
        // SAFETY: the trampoline calls `call` with `&mut f`; the record it
        // saves the stack pointer in is `armed`, alive across the call and
        // published in ARMED for the handler.
        let faulted = unsafe {
            ironsan_guarded_call(
                call,
                std::ptr::addr_of_mut!(f).cast(),
                std::ptr::addr_of_mut!(armed.rsp),
            )
        };
        ARMED.with(|a| a.set(prev));
        faulted == 0
    }

    /// Copies `len` bytes out of a mapping with `rep movsb`, whose fault
    /// on the source is recovered as a store's is; returns how many were
    /// not copied.
    ///
    /// # Safety
    /// `dst .. dst + len` must be writable and `src .. src + len` inside a
    /// mapping that lives for the call.
    pub(super) unsafe fn load(dst: *mut u8, src: *const u8, len: usize) -> usize {
        // SAFETY: the caller's obligations; faults are recovered.
        unsafe { ironsan_store_copy(dst, src, len) }
    }

    /// Copies `len` bytes; returns how many were not copied.
    ///
    /// # Safety
    /// `dst .. dst + len` must be inside a writable mapping that lives for
    /// the call, and `src .. src + len` readable memory.
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> usize {
        if len < super::NT_STORE_MIN {
            // SAFETY: the caller's obligations; faults are recovered.
            return unsafe { ironsan_store_copy(dst, src, len) };
        }
        // Up to a 64-byte boundary, whole lines non-temporally, the rest.
        let head = dst.align_offset(64).min(len);
        let body = (len - head) & !63;
        let tail = len - head - body;
        // SAFETY: the three pieces lie inside `dst .. dst + len` and
        // `src .. src + len`; the body starts 64-byte aligned and is a
        // non-zero multiple of 64 (len >= NT_STORE_MIN > 128). Each copy
        // returns what it could not store when a fault cut it short.
        unsafe {
            let left = ironsan_store_copy(dst, src, head);
            if left != 0 {
                return left + body + tail;
            }
            let left = ironsan_store_nt(dst.add(head), src.add(head), body);
            if left != 0 {
                return left + tail;
            }
            ironsan_store_copy(dst.add(head + body), src.add(head + body), tail)
        }
    }
}

impl FileMap {
    /// Calls `f` with bytes `off .. off + len` of the mapping, read in user
    /// space, in one or more pieces in order; false when they could not all
    /// be read (a range outside the mapping, a file cut short under it, a
    /// platform without the guarded read): then `f` may have seen some of
    /// them and the result of whatever it computed is void.
    ///
    /// # Safety
    /// Nothing may write the range while this runs (a [`crate::Pin`] that
    /// guards it), and every page of it must be in the page cache (a read
    /// fault on a hole would allocate it). `f` must own nothing that needs
    /// dropping, take no lock and not panic: a fault skips its frames
    /// (module docs).
    pub unsafe fn read_guarded(&self, off: usize, len: usize, f: &mut dyn FnMut(&[u8])) -> bool {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            let inside = off.checked_add(len).is_some_and(|e| e <= self.len());
            if !inside || !imp::install() {
                return false;
            }
            let lo = self.base().as_ptr() as usize + off;
            // SAFETY: inside the mapping, which lives as long as `self`;
            // the caller keeps writers off it, so the slice does not
            // change while it is read.
            let bytes = unsafe { std::slice::from_raw_parts(lo as *const u8, len) };
            let mut call = || f(bytes);
            // SAFETY: the caller's obligations on `f`; `call` itself owns
            // nothing.
            unsafe { imp::guarded(lo, lo + len, &mut call) }
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            let _ = (off, len, f);
            false
        }
    }

    /// Copies bytes `off .. off + dst.len()` of the mapping into `dst` from
    /// user space, recovering from a page that cannot be had (module docs);
    /// returns how many bytes were copied, from the front (the first
    /// `n` bytes of `dst` are then initialised). Fewer than `dst.len()`:
    /// the rest must be read with `pread(2)`, which reports why (a range
    /// outside the mapping, a file cut short, a full tmpfs, or a platform
    /// without the recovering copy: 0 copied).
    ///
    /// Safe, but not free of effects: reading a hole of a tmpfs file
    /// through the mapping allocates its page, so callers only load pages
    /// they know are there. A write racing the copy may show in it in part,
    /// as it may in `pread`'s.
    pub fn load(&self, off: usize, dst: &mut [std::mem::MaybeUninit<u8>]) -> usize {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            let inside = off.checked_add(dst.len()).is_some_and(|e| e <= self.len());
            if !inside || !imp::install() {
                return 0;
            }
            // SAFETY: `off .. off + len` lies inside the mapping, which
            // lives as long as `self`; `dst` is writable memory of that
            // length. The copy is one instruction outside Rust's memory
            // model (a racing store into the file is the kernel's or
            // `store`'s), and a fault in it returns what was left.
            let left = unsafe {
                imp::load(
                    dst.as_mut_ptr().cast(),
                    self.base().as_ptr().add(off),
                    dst.len(),
                )
            };
            dst.len() - left
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            let _ = (off, dst);
            0
        }
    }

    /// Stores `src` at byte `off` of the (writable) mapping from user space,
    /// recovering from a page that cannot be had (module docs); returns how
    /// many bytes were stored, from the front. Fewer than `src.len()`: the
    /// rest must go by `pwrite(2)`, which reports why (a read-only
    /// mapping, a range outside it, a file cut short, a full tmpfs, or a
    /// platform without the recovering copy: 0 stored).
    pub fn store(&self, off: usize, src: &[u8]) -> usize {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            let inside = off.checked_add(src.len()).is_some_and(|e| e <= self.len());
            if !self.is_writable() || !inside || !imp::install() {
                return 0;
            }
            // SAFETY: `off .. off + len` lies inside the mapping, which is
            // writable and lives as long as `self`; `src` is a slice.
            let left = unsafe { imp::copy(self.base().as_ptr().add(off), src.as_ptr(), src.len()) };
            let stored = src.len() - left;
            // A page stored into is in the page cache now.
            self.mark_present(off, stored);
            stored
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            let _ = (off, src);
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::sync::Arc;

    #[test]
    #[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
    fn stores_reach_the_file_and_a_page_gone_cuts_them_short() {
        let f = crate::unlinked_file(std::path::Path::new("/dev/shm"), "store").expect("/dev/shm");
        let f = Arc::new(f);
        f.write_all_at(&[0u8; 65536], 0).unwrap();
        let m = FileMap::writable(f.clone(), 65536).unwrap();
        let data: Vec<u8> = (0..20000u32).map(|i| (i * 7 + 1) as u8).collect();
        let want = if cfg!(all(target_arch = "x86_64", target_os = "linux")) {
            data.len()
        } else {
            0
        };
        assert_eq!(m.store(1000, &data), want);
        let mut back = vec![0u8; want];
        f.read_exact_at(&mut back, 1000).unwrap();
        assert_eq!(back, data[..want]);
        // Outside the mapping, or read-only: nothing stored.
        assert_eq!(m.store(60000, &data), 0);
        let ro = FileMap::new(&f, 65536).unwrap();
        assert_eq!(ro.store(0, &data), 0);
        if want == 0 {
            return;
        }
        // The file cut short under the mapping: the store stops at the
        // first page past the new end, and the process lives on.
        f.set_len(8192).unwrap();
        assert_eq!(m.store(4096, &data), 4096);
        assert_eq!(m.store(16384, &data[..100]), 0);
        // Grown back, the pages are there again.
        f.set_len(65536).unwrap();
        assert_eq!(m.store(16384, &data), data.len());
    }

    #[test]
    #[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
    fn large_stores_go_non_temporal_and_a_page_gone_cuts_them_short() {
        let f =
            crate::unlinked_file(std::path::Path::new("/dev/shm"), "storent").expect("/dev/shm");
        if !cfg!(all(target_arch = "x86_64", target_os = "linux")) {
            return;
        }
        const LEN: usize = 1 << 20;
        let f = Arc::new(f);
        f.write_all_at(&vec![0u8; LEN], 0).unwrap();
        let m = FileMap::writable(f.clone(), LEN).unwrap();
        // Unaligned at both ends: a head, a non-temporal body and a tail.
        let data: Vec<u8> = (0..NT_STORE_MIN as u32 + 1000)
            .map(|i| (i * 31 + 7) as u8)
            .collect();
        for off in [0, 1, 4095, 100_003] {
            assert_eq!(m.store(off, &data), data.len(), "at {off}");
            let mut back = vec![0u8; data.len()];
            f.read_exact_at(&mut back, off as u64).unwrap();
            assert!(back == data, "at {off}");
        }
        // Cut short inside the body: the store stops exactly at the end.
        f.set_len(65536).unwrap();
        assert_eq!(m.store(1000, &data), 65536 - 1000);
        // ... or right after the head.
        f.set_len(4096).unwrap();
        assert_eq!(m.store(4090, &data), 6);
        f.set_len(LEN as u64).unwrap();
        assert_eq!(m.store(3, &data), data.len());
    }

    /// A 64 KiB file on /dev/shm (unlinked) holding a pattern, a read-only
    /// mapping of it, and the pattern; `None` without /dev/shm.
    fn patterned(tag: &str, mul: u32) -> Option<(std::fs::File, FileMap, Vec<u8>)> {
        let f = crate::unlinked_file(std::path::Path::new("/dev/shm"), tag).ok()?;
        let data: Vec<u8> = (0..65536u32).map(|i| (i * mul + 3) as u8).collect();
        f.write_all_at(&data, 0).unwrap();
        let m = FileMap::new(&f, 65536).unwrap();
        Some((f, m, data))
    }

    #[test]
    #[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
    fn loads_copy_the_file_and_a_page_gone_cuts_them_short() {
        let (f, m, data) = patterned("load", 29).expect("/dev/shm");
        let on = cfg!(all(target_arch = "x86_64", target_os = "linux"));
        let mut buf = Vec::<u8>::with_capacity(65536);
        let n = m.load(1000, &mut buf.spare_capacity_mut()[..30000]);
        assert_eq!(n, if on { 30000 } else { 0 });
        if !on {
            return;
        }
        // SAFETY: `load` initialised the first `n` bytes.
        unsafe { buf.set_len(n) };
        assert_eq!(buf, data[1000..31000]);
        // Outside the mapping: nothing copied.
        assert_eq!(m.load(60000, &mut buf.spare_capacity_mut()[..8000]), 0);
        // The file cut short: the copy stops exactly at the new end, and
        // the process lives on; twice, to show the thread recovered.
        f.set_len(8192 + 4096).unwrap();
        for _ in 0..2 {
            let mut b = Vec::<u8>::with_capacity(20000);
            assert_eq!(
                m.load(4000, &mut b.spare_capacity_mut()[..20000]),
                12288 - 4000
            );
        }
    }

    #[test]
    #[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
    fn guarded_reads_see_the_file_and_survive_a_page_gone() {
        let (f, m, data) = patterned("guarded", 13).expect("/dev/shm");
        let on = cfg!(all(target_arch = "x86_64", target_os = "linux"));
        let mut seen = Vec::with_capacity(65536);
        // SAFETY: nothing writes the file meanwhile; its pages are all
        // there; the closure only appends to a Vec allocated beforehand
        // (no fault can happen here, so nothing is skipped).
        let ok = unsafe { m.read_guarded(1000, 30000, &mut |b| seen.extend_from_slice(b)) };
        assert_eq!(ok, on);
        if !on {
            return;
        }
        assert_eq!(seen, data[1000..31000]);
        // SAFETY: as above; outside the mapping nothing is read.
        assert!(!unsafe { m.read_guarded(60000, 8000, &mut |_| unreachable!()) });
        // The file cut short: the read of pages past the end faults, and
        // the call reports it instead of the process dying. Then again, to
        // show the recovery left the thread able to do it twice.
        f.set_len(8192).unwrap();
        for _ in 0..2 {
            let mut sum = 0u64;
            // SAFETY: the closure owns nothing and takes no lock.
            let ok = unsafe {
                m.read_guarded(4096, 20000, &mut |b| {
                    sum += b.iter().map(|&x| u64::from(x)).sum::<u64>()
                })
            };
            assert!(!ok, "pages past the new end cannot be read");
        }
        // A fault outside a guarded read is still fatal as before (not
        // tested: it would end the test process); the range inside is
        // fine.
        let mut n = 0;
        // SAFETY: as above.
        assert!(unsafe { m.read_guarded(0, 8192, &mut |b| n += b.len()) });
        assert_eq!(n, 8192);
    }
}
