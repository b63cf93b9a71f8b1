//! `zygote code ID -c '...'`: run Python in a sandbox's code interpreter (image
//! `code-interpreter`). Output is printed as it comes, the cell's value and other text
//! results after it, and each image result is saved to a file whose name is printed
//! (the terminal cannot show it). `--env K=V` (repeatable) sets variables for that one
//! execution. `--contexts`, `--new-context`, `--restart` and
//! `--remove` manage contexts.
use std::io::{Read, Write};
use std::path::PathBuf;

use zygote_api::client::block_on;
use zygote_api::model::{CodeEvent, CodeRequest, CreateContextRequest};

use super::daemon_client::{print_json, ApiArgs};

#[derive(clap::Args)]
pub struct CodeArgs {
    /// Sandbox id.
    id: String,
    /// The code (`-` or absent: read it from stdin).
    #[arg(long, short = 'c')]
    code: Option<String>,
    /// Context id (default: `default`).
    #[arg(long)]
    context: Option<String>,
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// Environment variable for this execution only, KEY=VALUE (repeatable): set in the
    /// kernel before the code runs, as it was again after.
    #[arg(long = "env", short = 'e')]
    env: Vec<String>,
    /// Where image results are saved (as result-<n>.<ext>).
    #[arg(long, default_value = ".")]
    out_dir: PathBuf,
    /// Print the events as NDJSON instead.
    #[arg(long)]
    json: bool,
    /// List the contexts and exit.
    #[arg(long, conflicts_with_all = ["code", "new_context", "restart", "remove"])]
    contexts: bool,
    /// Create a context (with this working directory, or `-` for the default) and
    /// print its id.
    #[arg(long, value_name = "CWD", conflicts_with_all = ["code", "restart", "remove"])]
    new_context: Option<String>,
    /// Restart this context (its state is lost) and exit.
    #[arg(long, value_name = "CONTEXT", conflicts_with_all = ["code", "remove"])]
    restart: Option<String>,
    /// Remove this context and exit.
    #[arg(long, value_name = "CONTEXT", conflicts_with = "code")]
    remove: Option<String>,
    #[command(flatten)]
    api: ApiArgs,
}

/// File extension of an image mime type worth saving.
fn image_ext(mime: &str) -> Option<&'static str> {
    match mime {
        "image/png" => Some("png"),
        "image/jpeg" => Some("jpg"),
        "image/svg+xml" => Some("svg"),
        "application/pdf" => Some("pdf"),
        _ => None,
    }
}

pub fn run(args: CodeArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    let id = &args.id;
    if args.contexts {
        for ctx in block_on(client.code_contexts(id))? {
            println!("{}\t{}\t{}", ctx.id, ctx.language, ctx.cwd);
        }
        return Ok(0);
    }
    if let Some(cwd) = args.new_context {
        let req = CreateContextRequest {
            cwd: (cwd != "-").then_some(cwd),
            ..Default::default()
        };
        println!("{}", block_on(client.create_code_context(id, &req))?.id);
        return Ok(0);
    }
    if let Some(ctx) = args.restart {
        block_on(client.restart_code_context(id, &ctx))?;
        return Ok(0);
    }
    if let Some(ctx) = args.remove {
        block_on(client.delete_code_context(id, &ctx))?;
        return Ok(0);
    }
    let code = match args.code.clone() {
        Some(c) if c != "-" => c,
        _ => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            s
        }
    };
    let req = code_request(&args, code)?;
    let mut saved = 0usize;
    let mut failed: Option<anyhow::Error> = None;
    let json = args.json;
    let out_dir = args.out_dir;
    let execution = block_on(client.run_code(id, &req, |event| {
        if json {
            let _ = print_json(event);
            return;
        }
        if let Err(e) = print_event(event, &out_dir, &mut saved) {
            failed.get_or_insert(e);
        }
    }))?;
    if let Some(e) = failed {
        return Err(e);
    }
    if let Some((code, message)) = &execution.failure {
        anyhow::bail!("{message} ({code})");
    }
    Ok(i32::from(execution.error.is_some()))
}

/// The `POST .../code` body for `code` with the options given.
fn code_request(args: &CodeArgs, code: String) -> anyhow::Result<CodeRequest> {
    let envs = super::exec::env_pairs(&args.env)?;
    Ok(CodeRequest {
        code,
        context: args.context.clone(),
        timeout_ms: args.timeout_ms,
        envs: (!envs.is_empty()).then(|| envs.into_iter().collect()),
        ..Default::default()
    })
}

fn print_event(
    event: &CodeEvent,
    out_dir: &std::path::Path,
    saved: &mut usize,
) -> anyhow::Result<()> {
    match event {
        CodeEvent::Stdout { text } => {
            print!("{text}");
            std::io::stdout().flush()?;
        }
        CodeEvent::Stderr { text } => eprint!("{text}"),
        CodeEvent::Result { data, .. } => {
            let mut wrote_image = false;
            for (mime, value) in data {
                let (Some(ext), Some(text)) = (image_ext(mime), value.as_str()) else {
                    continue;
                };
                let bytes = if ext == "svg" {
                    text.as_bytes().to_vec()
                } else {
                    zygote_proto::b64::decode(text)?
                };
                *saved += 1;
                let path = out_dir.join(format!("result-{saved}.{ext}"));
                std::fs::write(&path, bytes)?;
                println!("[{mime} saved to {}]", path.display());
                wrote_image = true;
            }
            if !wrote_image {
                if let Some(text) = data.get("text/plain").and_then(|v| v.as_str()) {
                    println!("{text}");
                }
            }
        }
        CodeEvent::Error {
            name,
            value,
            traceback,
        } => {
            for line in traceback {
                eprintln!("{line}");
            }
            if traceback.is_empty() {
                eprintln!("{name}: {value}");
            }
        }
        CodeEvent::Done { .. } | CodeEvent::Failure { .. } => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        code: CodeArgs,
    }

    fn request(argv: &[&str]) -> anyhow::Result<CodeRequest> {
        let cli = Cli::try_parse_from(std::iter::once("zygote").chain(argv.iter().copied()))
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        code_request(&cli.code, "1".into())
    }

    #[test]
    fn env_flags_become_the_execution_envs() {
        assert_eq!(request(&["sb-1", "-c", "1"]).unwrap().envs, None);
        let req = request(&["sb-1", "--env", "A=1", "-e", "B=x=y", "-e", "C="]).unwrap();
        let envs = req.envs.unwrap();
        assert_eq!(envs["A"], "1");
        assert_eq!(envs["B"], "x=y");
        assert_eq!(envs["C"], "");
        let e = request(&["sb-1", "--env", "NOVALUE"]).unwrap_err();
        assert!(e.to_string().contains("want KEY=VALUE"), "{e}");
    }
}
