use clap::Parser as _;

fn main() -> std::process::ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = tap_probe::cli::Cli::parse();
    match tap_probe::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("tap-probe: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
