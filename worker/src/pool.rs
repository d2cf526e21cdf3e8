//! Workers running in one process, started together and stopped together.

use tokio::sync::watch;
use tokio::task::JoinHandle;
use turnpike_schemas::WorkerId;

use crate::worker::Worker;

/// A set of running workers sharing one stop signal.
pub struct WorkerPool {
    stop: watch::Sender<bool>,
    handles: Vec<JoinHandle<()>>,
    ids: Vec<WorkerId>,
    workers: Vec<Worker>,
    /// Background tasks that live as long as the workers (e.g. the apps folder watch).
    companions: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    /// Starts every worker on its own task.
    pub fn start(workers: impl IntoIterator<Item = Worker>) -> Self {
        let (stop, stopped) = watch::channel(false);
        let mut handles = Vec::new();
        let mut ids = Vec::new();
        let mut all = Vec::new();
        for worker in workers {
            ids.push(worker.id());
            all.push(worker.clone());
            let mut stopped = stopped.clone();
            handles.push(tokio::spawn(async move {
                worker
                    .run(async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    })
                    .await
            }));
        }
        WorkerPool {
            stop,
            handles,
            ids,
            workers: all,
            companions: Vec::new(),
        }
    }

    /// Keeps `task` running while the workers run; it is aborted when they stop.
    pub fn keep(&mut self, task: JoinHandle<()>) {
        self.companions.push(task);
    }

    /// The workers' ids.
    pub fn ids(&self) -> &[WorkerId] {
        &self.ids
    }

    /// Stops every worker at once, as a crash would (for tests): no grace, no lease released.
    pub async fn crash(self) {
        for task in &self.companions {
            task.abort();
        }
        for handle in &self.handles {
            handle.abort();
        }
        for worker in &self.workers {
            worker.crash();
        }
        for handle in self.handles {
            let _ = handle.await;
        }
    }

    /// Stops every worker (each lets its running turns finish within its grace period) and
    /// waits for them.
    pub async fn stop(self) {
        for task in &self.companions {
            task.abort();
        }
        let _ = self.stop.send(true);
        for handle in self.handles {
            let _ = handle.await;
        }
    }
}
