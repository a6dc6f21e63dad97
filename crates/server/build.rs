//! Build script: see `build/shm_cfg.rs`.

include!("../../build/shm_cfg.rs");

fn main() {
    shm_cfg();
}
