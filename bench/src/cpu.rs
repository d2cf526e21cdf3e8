//! CPU time spent by this process and by a child (nats-server), to report what a turn costs in
//! CPU beside what it costs in wall time: on a shared, noisy machine the wall-time rate moves
//! with the neighbours more than CPU per operation does.

use std::time::Duration;

/// CPU time (user and system, every thread) used so far by this process, and by `other` (a
/// process id) when given and readable.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuTime {
    own: Duration,
    other: Option<Duration>,
}

/// CPU time used between two [`CpuTime`] readings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuUsed {
    pub own: Duration,
    pub other: Option<Duration>,
}

impl CpuTime {
    pub(crate) fn now(other: Option<u32>) -> Self {
        Self {
            own: own_cpu(),
            other: other.and_then(process_cpu),
        }
    }

    /// What was used from `self` until `later`.
    pub(crate) fn until(&self, later: &CpuTime) -> CpuUsed {
        CpuUsed {
            own: later.own.saturating_sub(self.own),
            other: match (self.other, later.other) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                _ => None,
            },
        }
    }
}

impl CpuUsed {
    /// Both spans together (the other process's only when both know it).
    pub(crate) fn plus(&self, more: &CpuUsed) -> CpuUsed {
        CpuUsed {
            own: self.own + more.own,
            other: self.other.zip(more.other).map(|(a, b)| a + b),
        }
    }

    /// Microseconds per operation: this process's, and the other's when known.
    pub(crate) fn per(&self, operations: usize) -> (f64, Option<f64>) {
        let n = operations.max(1) as f64;
        (
            self.own.as_secs_f64() * 1e6 / n,
            self.other.map(|o| o.as_secs_f64() * 1e6 / n),
        )
    }
}

/// This process's CPU time, to the microsecond.
fn own_cpu() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Another process's CPU time (Linux): the sum of its threads' time on a CPU from
/// `/proc/{pid}/task/*/schedstat`, to the nanosecond (threads that already ended are not
/// counted: a server keeps its threads); else `/proc/{pid}/stat`, in clock ticks (a hundredth
/// of a second: too coarse for a short run). `None` where neither can be read.
fn process_cpu(pid: u32) -> Option<Duration> {
    threads_on_cpu(pid).or_else(|| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        parse_stat(&stat, clock_ticks_per_second())
    })
}

fn threads_on_cpu(pid: u32) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut threads = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(task) = task else { continue };
        // A thread may end between the listing and the read.
        let Ok(line) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        total += parse_schedstat(&line)?;
        threads += 1;
    }
    (threads > 0).then_some(total)
}

/// The time on a CPU from a `schedstat` line: its first field, in nanoseconds.
fn parse_schedstat(line: &str) -> Option<Duration> {
    let nanos: u64 = line.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// User plus system time from a `/proc/{pid}/stat` line. The command name (field 2) may hold
/// spaces and parentheses, so the fields are counted from its last `)`: `utime` and `stime`
/// are fields 14 and 15.
fn parse_stat(stat: &str, ticks_per_second: u64) -> Option<Duration> {
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    let ticks = user.checked_add(system)?;
    Some(Duration::from_micros(
        ticks.checked_mul(1_000_000)? / ticks_per_second.max(1),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_past_a_command_name_with_spaces_and_parentheses() {
        let line = "4242 (nats (server) x) S 1 4242 4242 0 -1 4194560 1180 0 0 0 250 70 0 0 20 0 9 0 1000 1 1";
        assert_eq!(parse_stat(line, 100), Some(Duration::from_millis(3200)));
        assert_eq!(parse_stat(line, 1000), Some(Duration::from_millis(320)));
        assert_eq!(parse_stat("4242 (cut short) S 1 2", 100), None);
        assert_eq!(parse_stat("no parenthesis at all", 100), None);
        assert_eq!(
            parse_stat("1 (x) S 1 1 1 0 -1 0 0 0 0 0 many 70", 100),
            None
        );
    }

    #[test]
    fn schedstat_lines_give_the_time_on_a_cpu() {
        assert_eq!(
            parse_schedstat("217363018 24905302 889\n"),
            Some(Duration::from_nanos(217_363_018))
        );
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("-5 1 1"), None);
    }

    #[test]
    fn this_process_is_seen_using_cpu() {
        let before = CpuTime::now(Some(std::process::id()));
        let mut x = 0u64;
        let until = std::time::Instant::now() + Duration::from_millis(50);
        while std::time::Instant::now() < until {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let used = before.until(&CpuTime::now(Some(std::process::id())));
        assert!(used.own > Duration::ZERO);
        // Read as another process would be: its threads' time (or ticks) grew too.
        let other = used
            .other
            .expect("this process's own /proc entry is readable");
        assert!(other > Duration::ZERO);
    }
}
