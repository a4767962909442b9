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
    Args::parse().run().await
}
