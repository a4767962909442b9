use clap::Parser;
use farm_apiserver::config::Args;

// glibc malloc spent ~10% of the CPU of a GET (fastbin consolidation, cross-thread frees);
// mimalloc's thread-local free lists make that ~2%. See the bench section of README.md.
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
