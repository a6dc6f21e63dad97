// Included by the build scripts of the crates whose tests need /dev/shm
// (a tmpfs): emits `cfg(no_shm)` where this machine has none, so that those
// tests are reported ignored with the reason instead of passing unrun.

/// Emits `cargo::rustc-cfg=no_shm` when /dev/shm is not a directory a
/// file can be created in.
fn shm_cfg() {
    println!("cargo::rustc-check-cfg=cfg(no_shm)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=../../build/shm_cfg.rs");
    let probe = std::path::Path::new("/dev/shm").join(format!(".ironsan-build-{}", std::process::id()));
    let usable = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    if !usable {
        println!("cargo::rustc-cfg=no_shm");
        println!("cargo::warning=no usable /dev/shm: the tests that need it are ignored");
    }
}
