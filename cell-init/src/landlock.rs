//! Landlock, the cell's second wall on the filesystem: applied inside the sandbox (by
//! the cell's init, after bubblewrap has built the mounts, since a Landlock-restricted
//! process may not change mounts) just before the interpreter starts. Beneath `/usr`: read and
//! execute; `/proc` and `/dev`: read (and write files, for `/dev/null`); `/work` and `/tmp`:
//! everything; anything else: nothing. Where the kernel has no Landlock, the cell still runs
//! inside bubblewrap (the first wall); the status says which.

use landlock::{
    path_beneath_rules, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    ABI,
};

/// Restricts the calling process (and what it starts), with `readable` granted read and
/// execute like `/usr` (a sandboxed server's own installation); returns how fully it is
/// enforced: `full`, `partial` or `none`.
pub fn restrict(readable: &[std::path::PathBuf]) -> Result<&'static str, String> {
    let abi = ABI::V1;
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let status = Ruleset::default()
        .handle_access(all)
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(path_beneath_rules(["/usr"], read)))
        .and_then(|r| r.add_rules(path_beneath_rules(readable, read)))
        .and_then(|r| {
            r.add_rules(path_beneath_rules(
                ["/proc", "/dev"],
                read | AccessFs::WriteFile,
            ))
        })
        .and_then(|r| r.add_rules(path_beneath_rules(["/work", "/tmp"], all)))
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("landlock: {e}"))?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => "full",
        RulesetStatus::PartiallyEnforced => "partial",
        RulesetStatus::NotEnforced => "none",
    })
}
