use clap::Parser;
use farm_apiserver::config::Args;

// glibc malloc spent ~10% of the CPU of a GET under load (fastbin consolidation, cross-thread
// frees); mimalloc about half that. `no_thp` keeps its arenas off huge pages, so idle RSS stays
// small.
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
