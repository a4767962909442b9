//! Link options for the server binary on x86_64 Linux with Rust's default linker there (LLD),
//! where both are known to be accepted; elsewhere the binary links as Cargo would.
//! - `--symbol-ordering-file=symbol.order`: the functions start-up and requests run,
//!   laid out together (see bench/symbol-order): an idle server maps a few MB of code, not
//!   most of its 17 MB. Symbols the file names and the binary lacks are skipped.
//! - `-z pack-relative-relocs` (RELR): the position-independent binary's 33,000 relative
//!   relocations take a few KB instead of 800 KB that the loader reads at every start. It
//!   needs glibc 2.36 where the binary runs (Debian 12, the image's distroless base), so it is
//!   used only when the glibc it is built against is that recent.
//! - `-z max-page-size=0x10000`: segments aligned to 64 KiB in the file and in memory, so the
//!   kernel loads the binary at a 64 KiB boundary. Its code then lines up with the page cache's
//!   large folios and the kernel's 64 KiB fault-around windows; unaligned, each fault maps two
//!   windows' worth of a cached binary (about 1 MiB more of an idle server's RSS).
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=symbol.order");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let target = std::env::var("TARGET").unwrap_or_default();
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    // Another linker (or linker flavour) chosen: its options are not known here.
    if target != "x86_64-unknown-linux-gnu"
        || std::env::var_os("RUSTC_LINKER").is_some()
        || flags.contains("linker")
        || flags.contains("fuse-ld")
    {
        return;
    }
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let order = std::path::Path::new(&manifest).join("symbol.order");
    if order.exists() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
    println!("cargo:rustc-link-arg-bins=-Wl,-z,max-page-size=0x10000");
    if glibc_at_least(2, 36) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether this machine's glibc (the one the binary links against) is `major.minor` or newer.
fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    // "glibc 2.36"
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text
        .trim()
        .trim_start_matches("glibc ")
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}
