//! Failpoints: named places where a test makes a worker hang (until it is killed) or pause, to
//! crash it at a step boundary. They exist only with the `failpoints` cargo feature, which only
//! the tests enable (as a dev-dependency feature): a release build has none, and reaching one
//! costs nothing.
//!
//! A worker process reads them from `TURNPIKE_FAILPOINTS` (`name=action[,name=action…]`, where
//! an action is `hang` or `pause(<ms>)`); an in-process test sets them in
//! `WorkerConfig::failpoints` (in `turnpike-worker`). Reaching one prints
//! `failpoint <name>: <action> at <where>` on stderr first, which the tests wait for.
//!
//! The places: `claim-won` (a wake's lease claim won, its owner not registered yet),
//! `after-claim` (a lease taken, its owner running), `before-release` (an owner done, out of
//! the owner map, its lease not released yet), `after-batch-one` (a turn's batch one committed),
//! `before-batch-two` (the turn's log and version written), `before-promotion` (batch two
//! committed, the attempt's objects not promoted yet, its context snapshot not written),
//! `drain-end` (a drain over with every turn closed, its open-turn mark not cleared yet),
//! `after-dead-letter` (a lane message kept as a dead letter, its `lane_parked` entry not
//! committed yet), `schedule-claimed` (a schedule's firing claimed, nothing of it done yet),
//! `schedule-conversation` (the firing's new conversation created, its message not published
//! yet).

/// The failpoints a worker is configured with.
#[derive(Debug, Clone, Default)]
pub struct Failpoints {
    #[cfg(feature = "failpoints")]
    actions: std::sync::Arc<Vec<(String, Action)>>,
}

/// What a worker does at a failpoint.
#[cfg(feature = "failpoints")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Never goes on (the test kills the process).
    Hang,
    /// Goes on after this long.
    Pause(std::time::Duration),
}

impl Failpoints {
    /// The failpoints in `TURNPIKE_FAILPOINTS` (none without the feature, or when unset).
    pub fn from_env() -> Result<Self, String> {
        #[cfg(feature = "failpoints")]
        if let Ok(text) = std::env::var("TURNPIKE_FAILPOINTS") {
            return Self::parse(&text);
        }
        Ok(Self::default())
    }

    /// Reaches the failpoint `name` at `place`: hangs or pauses when it is set.
    pub async fn hit(&self, name: &str, place: impl std::fmt::Display) {
        #[cfg(feature = "failpoints")]
        if let Some((_, action)) = self.actions.iter().find(|(n, _)| n == name) {
            eprintln!("failpoint {name}: {action:?} at {place}");
            match action {
                Action::Hang => std::future::pending::<()>().await,
                Action::Pause(d) => tokio::time::sleep(*d).await,
            }
        }
        #[cfg(not(feature = "failpoints"))]
        let _ = (name, place.to_string());
    }
}

#[cfg(feature = "failpoints")]
impl Failpoints {
    /// Parses `name=action[,name=action…]`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut actions = Vec::new();
        for item in text.split(',').filter(|i| !i.trim().is_empty()) {
            let (name, action) = item
                .split_once('=')
                .ok_or_else(|| format!("failpoint {item:?}: expected name=action"))?;
            let action = match action.trim() {
                "hang" => Action::Hang,
                other => {
                    let ms = other
                        .strip_prefix("pause(")
                        .and_then(|r| r.strip_suffix(')'))
                        .and_then(|ms| ms.parse().ok())
                        .ok_or_else(|| {
                            format!("failpoint {name}: {other:?} is not hang or pause(<ms>)")
                        })?;
                    Action::Pause(std::time::Duration::from_millis(ms))
                }
            };
            actions.push((name.trim().to_owned(), action));
        }
        Ok(Self {
            actions: std::sync::Arc::new(actions),
        })
    }

    /// These failpoints and `name` set to `action`.
    pub fn with(&self, name: &str, action: Action) -> Self {
        let mut actions = (*self.actions).clone();
        actions.push((name.to_owned(), action));
        Self {
            actions: std::sync::Arc::new(actions),
        }
    }
}

#[cfg(all(test, feature = "failpoints"))]
mod tests {
    use super::*;

    #[test]
    fn failpoints_parse_and_refuse_what_they_cannot_read() {
        let f = Failpoints::parse("after-claim=hang, before-batch-two=pause(250)").unwrap();
        assert_eq!(
            *f.actions,
            [
                ("after-claim".to_owned(), Action::Hang),
                (
                    "before-batch-two".to_owned(),
                    Action::Pause(std::time::Duration::from_millis(250))
                )
            ]
        );
        assert!(Failpoints::parse("after-claim").is_err());
        assert!(Failpoints::parse("after-claim=explode").is_err());
    }
}
