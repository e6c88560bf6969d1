//! `ShouldRateLimit` throughput, latency, server CPU and exactness of
//! ratewarden-server beside a RateLimitService on limitador.
//!
//! ```text
//! envoy-rls-bench compare [--store memory|redis://HOST:PORT] [--tasks 1,16,64]
//! envoy-rls-bench serve ratewarden|ratewarden-leased|limitador|limitador-cached --store S --listen ADDR --limit N
//! ```

mod compare;
mod limitador_rls;
mod serve;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(about = "ratewarden-server beside limitador, over Envoy's rate-limit gRPC")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs one contender until SIGTERM or ctrl-c.
    Serve {
        contender: Contender,
        /// `memory`, or a redis:// URL.
        #[arg(long, default_value = "memory")]
        store: String,
        #[arg(long, default_value = "127.0.0.1:8081")]
        listen: SocketAddr,
        /// Decisions admitted per user per hour.
        #[arg(long, default_value_t = 1_000_000)]
        limit: u64,
    },
    /// Starts each contender as a child process and loads each in turn.
    Compare(compare::Args),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Contender {
    Ratewarden,
    /// ratewarden-server buying units from Redis in leases of up to 16
    /// (`--lease 16`; Redis only): fewer round trips, never over.
    RatewardenLeased,
    /// limitador's in-memory storage, or its exact Redis storage.
    Limitador,
    /// limitador's cached Redis storage (Redis only).
    LimitadorCached,
}

impl Contender {
    /// The ratewarden contender a peer is compared with: the exact one, or
    /// for limitador's cached mode the one that also spares round trips.
    pub fn baseline(self) -> Option<Contender> {
        match self {
            Contender::Limitador => Some(Contender::Ratewarden),
            Contender::LimitadorCached => Some(Contender::RatewardenLeased),
            Contender::Ratewarden | Contender::RatewardenLeased => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Contender::Ratewarden => "ratewarden",
            Contender::RatewardenLeased => "ratewarden-leased",
            Contender::Limitador => "limitador",
            Contender::LimitadorCached => "limitador-cached",
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let result = match cli.command {
        Command::Serve {
            contender,
            store,
            listen,
            limit,
        } => runtime.block_on(serve::run(contender, &store, listen, limit)),
        Command::Compare(args) => runtime.block_on(compare::run(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("envoy-rls-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
