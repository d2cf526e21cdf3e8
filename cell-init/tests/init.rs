//! The small init, run as a cell runs it (here outside bubblewrap: Landlock alone).

use std::process::Command;

#[test]
fn the_init_applies_landlock_and_then_becomes_the_program() {
    let out = Command::new(env!("CARGO_BIN_EXE_turnpike-cell-init"))
        .args(["--", "/bin/sh", "-c"])
        .arg("echo \"landlock=$CELL_LANDLOCK\"; if cat /etc/hostname >/dev/null 2>&1; then echo ESCAPED; else echo CONTAINED; fi")
        .output()
        .expect("the init runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("landlock=full") || stdout.contains("landlock=partial"),
        "{stdout}"
    );
    // Outside /usr, /proc, /dev, /work and /tmp nothing can be read.
    assert!(stdout.contains("CONTAINED"), "{stdout}");
}

#[test]
fn without_a_program_the_init_refuses() {
    let out = Command::new(env!("CARGO_BIN_EXE_turnpike-cell-init"))
        .arg("--")
        .output()
        .expect("the init runs");
    assert_eq!(out.status.code(), Some(126));
}

#[test]
fn a_path_granted_with_read_can_be_read_and_no_other() {
    let out = Command::new(env!("CARGO_BIN_EXE_turnpike-cell-init"))
        .args(["--read", "/etc/hostname", "--", "/bin/sh", "-c"])
        .arg("cat /etc/hostname >/dev/null 2>&1 && echo READ; if cat /etc/passwd >/dev/null 2>&1; then echo ESCAPED; else echo CONTAINED; fi")
        .output()
        .expect("the init runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("READ"), "{stdout}");
    assert!(stdout.contains("CONTAINED"), "{stdout}");
}
