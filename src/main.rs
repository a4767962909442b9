use clap::Parser;
use farm_apiserver::config::Args;

// mimalloc, arenas off huge pages (see PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // ring is the only provider compiled in; installing it makes that explicit.
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        anyhow::bail!("a rustls crypto provider was already installed");
    }
    Args::parse().run(release_spare_memory).await
}

/// Gives the memory start-up used and freed (the documents built once, the certificates and
/// kubeconfig parsed, the caches' first lists) back to the OS, once serving and again once
/// ready, each time from the calling thread's heap and the abandoned ones. mimalloc returns
/// freed pages only after a delay, and only when later allocations or frees look: an idle
/// server kept about 1 MiB it no longer used.
fn release_spare_memory() {
    // SAFETY: mi_collect takes no pointers; it may be called at any time from any thread.
    unsafe { libmimalloc_sys::mi_collect(true) }
}
