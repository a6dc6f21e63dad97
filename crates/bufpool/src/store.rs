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
//! x86-64 Linux only; elsewhere [`FileMap::store`] stores nothing and the
//! caller writes with `pwrite(2)`.

use crate::FileMap;

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

    extern "C" {
        fn ironsan_store_copy(dst: *mut u8, src: *const u8, len: usize) -> usize;
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

    /// Copies `len` bytes; returns how many were not copied.
    ///
    /// # Safety
    /// `dst .. dst + len` must be inside a writable mapping that lives for
    /// the call, and `src .. src + len` readable memory.
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> usize {
        // SAFETY: the caller's obligations; a SIGBUS in the copy is
        // recovered by the handler (`install` has run).
        unsafe { ironsan_store_copy(dst, src, len) }
    }
}

impl FileMap {
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
            src.len() - left
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
    fn stores_reach_the_file_and_a_page_gone_cuts_them_short() {
        let Ok(f) = crate::unlinked_file(std::path::Path::new("/dev/shm"), "store") else {
            return;
        };
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
}
