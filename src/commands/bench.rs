//! `turnpike bench …`: the wiring for the benchmarks of `turnpike-bench` (the configuration, and
//! the stack `bench edge` measures).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use turnpike_bench::edge::{EdgeStack, Plan};
use turnpike_bench::search::{Scale, SearchConfig};
use turnpike_index::eval::{Files, Grades, JudgmentsFormat, QueryNumbering};
use turnpike_router::Ingress;
use turnpike_worker::WorkerConfig;

use crate::cli::{
    BenchCommand, EdgeArgs, Global, GradesArg, JudgmentsFormatArg, QueryNumberingArg,
};
use crate::commands::runtime::{open_bus, workers};
use crate::env::Env;

pub async fn run(global: &Global, command: BenchCommand) -> Result<ExitCode> {
    let mut search = SearchConfig {
        database_url: global.index.database_url.clone(),
        embedding_model: global.index.embedding_model.clone(),
        build_memory_mib: None,
    };
    match command {
        BenchCommand::Search {
            collection,
            json,
            query_numbering,
            grades,
            dir,
            docs,
            queries,
            judgments,
            judgments_format,
        } => {
            let files = Files {
                docs,
                queries,
                judgments,
                judgments_format: match judgments_format {
                    JudgmentsFormatArg::Auto => JudgmentsFormat::Auto,
                    JudgmentsFormatArg::Smart => JudgmentsFormat::Smart,
                    JudgmentsFormatArg::Trec => JudgmentsFormat::Trec,
                },
            };
            let numbering = match query_numbering {
                QueryNumberingArg::Position => QueryNumbering::Position,
                QueryNumberingArg::Id => QueryNumbering::Id,
            };
            let grades = match grades {
                GradesArg::LowerIsBetter => Grades::LowerIsBetter,
                GradesArg::HigherIsBetter => Grades::HigherIsBetter,
            };
            turnpike_bench::search::quality(
                &search,
                &collection,
                &files,
                json,
                numbering,
                grades,
                dir,
            )
            .await
        }
        BenchCommand::Index {
            rows,
            users,
            queries,
            backend,
            dir,
            keep,
            reuse_tenant,
            build_memory,
        } => {
            search.build_memory_mib = Some(build_memory);
            let scale = Scale {
                rows: rows.max(1000),
                users: users.max(1),
                queries: queries.max(10),
                backend,
                dir,
                keep,
                reuse: reuse_tenant,
            };
            turnpike_bench::search::scale(&search, scale).await
        }
        BenchCommand::Embed { collection, docs } => {
            turnpike_bench::search::embed(&search, &collection, &Files::default(), docs).await
        }
        BenchCommand::Record { appends, dir } => {
            turnpike_bench::record::run(appends.max(16), dir, !global.no_fsync).await
        }
        BenchCommand::Cell {
            runs,
            without_landlock,
        } => {
            let init = if without_landlock {
                None
            } else {
                super::runtime::cell_init_binary()
            };
            turnpike_bench::cell::run(runs.max(10), init).await
        }
        BenchCommand::Mcp {
            venv,
            calls,
            starts,
        } => turnpike_bench::mcp::run(venv, calls.max(10), starts.max(2)).await,
        BenchCommand::Git { turns, dir } => turnpike_bench::git::run(turns.max(10), dir).await,
        BenchCommand::Context {
            samples,
            dir,
            store,
        } => turnpike_bench::context::run(samples.max(5), dir, store).await,
        BenchCommand::Edge {
            conversations,
            rounds,
            messages,
            clients,
            accept_only,
            dir,
        } => {
            let (_tmp, stack) = demo_edge_stack(global, dir.as_deref()).await?;
            let plan = Plan {
                conversations,
                rounds,
                messages: messages.max(1),
                clients: clients.max(1),
                accept_only,
            };
            turnpike_bench::edge::run(stack, plan).await
        }
        BenchCommand::A2a {
            rounds,
            messages,
            clients,
            dir,
        } => {
            let (_tmp, stack) = demo_edge_stack(global, dir.as_deref()).await?;
            let plan = turnpike_bench::a2a::Plan {
                rounds: rounds.max(1),
                messages: messages.max(1),
                clients: clients.max(1),
            };
            turnpike_bench::a2a::run(stack, plan).await
        }
        BenchCommand::Model {
            url,
            model,
            samples,
            turns,
        } => {
            let _local = if url == super::demo::LOCAL_MODEL_URL {
                super::demo::local_model().await?
            } else {
                None
            };
            let (tools_url, calls, proxy) = turnpike_bench::model::timing_proxy(&url).await?;
            let tmp = tempfile::tempdir()?;
            let apps = tmp.path().join("apps");
            std::fs::create_dir_all(&apps)?;
            std::fs::write(
                apps.join("bench-model.toml"),
                turnpike_bench::model::manifest(&url, &tools_url, &model),
            )?;
            let mut g = global.clone();
            g.apps = Some(apps);
            let stack = edge_stack(&g, tmp.path().join("data")).await?;
            let plan = turnpike_bench::model::Plan {
                url,
                model,
                samples: samples.max(1),
                turns,
            };
            let code = turnpike_bench::model::run(stack, plan, calls).await;
            proxy.abort();
            code
        }
        BenchCommand::Erase {
            conversations,
            dir,
            store,
        } => turnpike_bench::erase::run(conversations.max(1), dir, store).await,
        BenchCommand::Remote { samples, actions } => {
            let (url, app) = turnpike_bench::remote::app_server().await?;
            let tmp = tempfile::tempdir()?;
            let apps = tmp.path().join("apps");
            std::fs::create_dir_all(&apps)?;
            std::fs::write(
                apps.join("bench-remote.toml"),
                turnpike_bench::remote::manifest(&url),
            )?;
            let mut g = global.clone();
            g.apps = Some(apps);
            let stack = edge_stack(&g, tmp.path().join("data")).await?;
            let code = turnpike_bench::remote::run(stack, samples.max(5), actions.max(2)).await;
            app.abort();
            code
        }
        BenchCommand::Fleet {
            routers,
            workers,
            slots,
            model_delay_ms,
            turns,
            nats_server,
        } => {
            let nats_server = if nats_server.components().count() == 1 {
                which(&nats_server).unwrap_or(nats_server)
            } else {
                nats_server
            };
            turnpike_bench::fleet::run(turnpike_bench::fleet::Plan {
                binary: std::env::current_exe()?,
                nats_server,
                routers,
                workers,
                slots: slots.max(1),
                model_delay: Duration::from_millis(model_delay_ms),
                turns: turns.max(1),
            })
            .await
        }
        BenchCommand::Fairness {
            bursts,
            workers,
            slots,
            turn_ms,
            singles,
            embedded_only,
        } => {
            turnpike_bench::fairness::run(turnpike_bench::fairness::Plan {
                bursts,
                workers: workers.max(1),
                slots: slots.max(1),
                turn: Duration::from_millis(turn_ms),
                singles: singles.max(1),
                jetstream: !embedded_only,
            })
            .await
        }
        BenchCommand::Schedules {
            schedules,
            every_secs,
            window_secs,
            workers,
        } => {
            turnpike_bench::schedules::run(turnpike_bench::schedules::Plan {
                schedules: schedules.max(1),
                every: Duration::from_secs(every_secs.max(1)),
                window: Duration::from_secs(window_secs.max(1)),
                workers,
            })
            .await
        }
        BenchCommand::Webhooks {
            deliveries,
            dispatchers,
            concurrency,
        } => {
            turnpike_bench::webhooks::run(turnpike_bench::webhooks::Plan {
                deliveries: deliveries.max(1),
                dispatchers,
                concurrency: concurrency.max(1),
            })
            .await
        }
        BenchCommand::Soak {
            turns,
            conversations,
            clients,
            samples,
            warm_up_percent,
            nats_server,
            turns_per_conversation,
            fleet_only,
        } => {
            let nats_server = match nats_server.to_str() {
                Some("none") => None,
                _ if nats_server.components().count() == 1 => {
                    Some(which(&nats_server).unwrap_or(nats_server))
                }
                _ => Some(nats_server),
            };
            turnpike_bench::soak::run(turnpike_bench::soak::Plan {
                binary: std::env::current_exe()?,
                nats_server,
                turns,
                conversations,
                clients,
                samples,
                warm_up_percent: warm_up_percent.min(99),
                per_conversation: turns_per_conversation,
                fleet_only,
            })
            .await
        }
        BenchCommand::Lanes {
            nats,
            conversations,
            turns,
            samples,
            workers,
            metrics,
            repeat,
        } => {
            if metrics {
                crate::commands::admin::metrics();
            }
            turnpike_bench::lanes::run(turnpike_bench::lanes::Options {
                fsync: !global.no_fsync,
                // The workers' store: the embedded default's database unless `--local-store files`.
                sqlite: global.local_store != Some(crate::cli::LocalStore::Files),
                store: global.store.clone(),
                nats,
                conversations: conversations.max(1),
                turns: turns.max(1),
                samples: samples.max(1),
                workers: workers.max(1),
                repeat: repeat.max(1),
            })
            .await
        }
    }
}

/// [`edge_stack`] over the demo app with its data in a temporary directory (under `dir`, if
/// given), said on stdout; the directory lives as long as the first value.
async fn demo_edge_stack(
    global: &Global,
    dir: Option<&std::path::Path>,
) -> Result<(tempfile::TempDir, EdgeStack)> {
    let tmp = match dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let stack = edge_stack(global, tmp.path().to_path_buf()).await?;
    println!(
        "edge on {}, one worker, the demo app's scripted model; data in {}",
        stack.url,
        tmp.path().display()
    );
    Ok((tmp, stack))
}

/// `turnpike serve`'s stack in this process, on loopback, with its data in `data_dir`: the
/// embedded bus, one worker with many slots, the edge with a generated token.
async fn edge_stack(global: &Global, data_dir: PathBuf) -> Result<EdgeStack> {
    let mut g = global.clone();
    g.data_dir = data_dir;
    g.nats_url = None;
    g.store = None;
    let env = Env::open(&g)?;
    let bus = open_bus(&g, &env, Duration::from_secs(30)).await?;
    let apps = env.apps(true)?;
    let config = WorkerConfig {
        slots: 512,
        ..WorkerConfig::default()
    };
    let pool = super::runtime::start_pool(&g, workers(&env, &bus, &apps, 1, &config, None).await)?;
    let args = EdgeArgs {
        listen: "127.0.0.1:0".parse()?,
        tokens: None,
        jwks: None,
        jwks_url: None,
        jwt_discover: false,
        jwt_issuer: String::new(),
        jwt_audience: String::new(),
        jwt_identity_scope: String::new(),
        jwt_tenant_claim: String::new(),
        jwt_admin_claim: String::new(),
        rate_per_second: 0,
        rate_burst: 0,
        max_in_flight: 8192,
        max_rounds: None,
        required_approver: None,
        ws_grace_ms: 0,
        book: None,
    };
    let edge = super::edge::build(&g, &env, bus.clone(), &apps, None, &args, true).await?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        let _ = edge.serve(listener, std::future::pending()).await;
    });
    Ok(EdgeStack {
        url: format!("http://{addr}"),
        token: super::edge::local_token(&g).context("the generated token")?,
        owner: super::edge::LOCAL_IDENTITY.parse()?,
        ingress: Ingress::new(bus.clone(), env.conversations.clone()),
        bus,
        workers: pool,
        server,
    })
}

/// `name` on the PATH, if it is there.
fn which(name: &std::path::Path) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| std::path::Path::new(dir).join(name))
        .find(|p| p.is_file())
}
