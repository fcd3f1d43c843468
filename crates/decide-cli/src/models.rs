//! `decide models`: list, locate and download models.

use std::io::Write;

use decide_engine::{resolve, Manifest};

use crate::args::{Global, ModelsArgs, ModelsCommand};

pub fn run(_global: &Global, args: ModelsArgs) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match args.command {
        ModelsCommand::List => {
            for m in Manifest::builtin() {
                let place = match resolve(&m.name) {
                    Ok(loc) => loc.dir.display().to_string(),
                    Err(_) => "not on this machine".into(),
                };
                writeln!(
                    out,
                    "{:<20} {:<13} {:<40} {place}",
                    m.name,
                    m.head.as_str(),
                    m.hf_id
                )?;
            }
            Ok(())
        }
        ModelsCommand::Path { name } => {
            let loc = resolve(&name)?;
            writeln!(out, "{}", loc.dir.display())?;
            Ok(())
        }
        ModelsCommand::Pull { name } => pull(&name),
    }
}

#[cfg(feature = "hub")]
fn pull(name: &str) -> anyhow::Result<()> {
    let loc = decide_engine::pull(name)?;
    writeln!(
        std::io::stdout(),
        "{} is in {}",
        loc.name,
        loc.dir.display()
    )?;
    Ok(())
}

#[cfg(not(feature = "hub"))]
fn pull(name: &str) -> anyhow::Result<()> {
    anyhow::bail!(
        "cannot pull '{name}': this build has no `hub` feature (rebuild with --features hub)"
    )
}
