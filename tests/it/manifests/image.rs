//! The Dockerfile, CI's build command and the node image built from the Dockerfile's final stage.

use super::*;

/// No image can be built here, so CI builds what the Dockerfile builds, with the very same
/// cargo command.
#[test]
fn ci_runs_the_dockerfiles_build_command() {
    const BUILD: &str = "cargo build --profile dist --locked -p farm-apiserver";
    let dockerfile = include_str!("../../../Dockerfile");
    let ci = include_str!("../../../.ci/run");
    assert!(
        dockerfile.contains(BUILD),
        "the Dockerfile builds with {BUILD:?}"
    );
    assert!(
        ci.lines().any(|l| l.trim() == BUILD),
        ".ci/run runs {BUILD:?} on a line of its own"
    );
}

/// The image's build sees the whole workspace: the Dockerfile copies every member's folder (cargo
/// refuses a workspace with a member missing), which CI's build from the clone cannot show.
#[test]
fn the_dockerfile_copies_every_workspace_member() {
    let manifest = include_str!("../../../Cargo.toml");
    let dockerfile = include_str!("../../../Dockerfile");
    let members = manifest
        .lines()
        .find_map(|l| l.strip_prefix("members = "))
        .expect("[workspace] members on one line");
    let members: Vec<String> = serde_json::from_str(members).unwrap();
    assert!(members.iter().any(|m| m == "fieldmanager"), "{members:?}");
    for member in members.iter().filter(|m| *m != ".") {
        let copy = format!("COPY {member} ./{member}");
        assert!(
            dockerfile.lines().any(|l| l.trim() == copy),
            "the Dockerfile has no {copy:?}"
        );
    }
}

/// The final stage of the Dockerfile, read as docker reads it: (USER, ENTRYPOINT, CMD, EXPOSE).
pub(super) fn dockerfile_final_stage() -> (String, Value, Value, Vec<String>) {
    let dockerfile = include_str!("../../../Dockerfile");
    let last = dockerfile.rsplit("\nFROM ").next().unwrap();
    let instruction = |word: &str| {
        last.lines()
            .find_map(|l| l.strip_prefix(word).map(str::trim))
            .unwrap_or_else(|| panic!("{word} in the final stage"))
            .to_owned()
    };
    (
        instruction("USER "),
        serde_json::from_str(&instruction("ENTRYPOINT ")).unwrap(),
        serde_json::from_str(&instruction("CMD ")).unwrap(),
        instruction("EXPOSE ")
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    )
}

/// No docker here: tests/node/image.py assembles the image the lab node runs. It must be the
/// Dockerfile's final stage: the same build, user, entrypoint, arguments and port, and only the
/// binary, the libraries it links and the nonroot user in it.
#[test]
fn the_node_image_is_the_dockerfiles_final_stage() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/node/image.py");
    let python = |args: &[&str]| Command::new("python3").arg(script).args(args).output();
    let Ok(printed) = python(&["--print-config"]) else {
        eprintln!("SKIPPED: python3 is not on PATH");
        return;
    };
    assert!(printed.status.success(), "{printed:?}");
    let printed: Value = serde_json::from_slice(&printed.stdout).unwrap();
    let (user, entrypoint, cmd, expose) = dockerfile_final_stage();
    assert_eq!(
        printed["build"],
        "cargo build --profile dist --locked -p farm-apiserver"
    );
    assert!(include_str!("../../../Dockerfile").contains(printed["build"].as_str().unwrap()));
    assert_eq!(printed["user"], user);
    assert_eq!(printed["entrypoint"], entrypoint);
    assert_eq!(printed["cmd"], cmd);
    assert_eq!(printed["expose"], json!(expose));

    // Assembled from this build's binary: what is in it.
    let out = tempfile::tempdir().unwrap();
    let binary = env!("CARGO_BIN_EXE_farm-apiserver");
    let made = python(&[
        "--binary",
        binary,
        "--out",
        out.path().to_str().unwrap(),
        "--tag",
        "test",
        "--no-import",
    ])
    .unwrap();
    assert!(made.status.success(), "{made:?}");
    let archive = out.path().join("farm-apiserver_test.tar");
    let unpacked = out.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    let tar = |args: &[&str]| {
        let out = Command::new("tar").args(args).output().expect("tar");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    tar(&[
        "-xf",
        archive.to_str().unwrap(),
        "-C",
        unpacked.to_str().unwrap(),
    ]);
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(unpacked.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(
        manifest[0]["RepoTags"],
        json!(["docker.io/library/farm-apiserver:test"])
    );
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(unpacked.join(manifest[0]["Config"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    assert_eq!(config["config"]["User"], user);
    assert_eq!(config["config"]["Entrypoint"], entrypoint);
    assert_eq!(config["config"]["Cmd"], cmd);
    let layer = unpacked.join(manifest[0]["Layers"][0].as_str().unwrap());
    let listing = tar(&["--numeric-owner", "-tvf", layer.to_str().unwrap()]);
    let ldd = Command::new("ldd").arg(binary).output().unwrap();
    let libraries: Vec<String> = String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(|w| w.trim_start_matches('/').to_owned())
        .collect();
    assert!(!libraries.is_empty());
    let mut files = Vec::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (mode, owner, name) = (fields[0], fields[1], *fields.last().unwrap());
        if mode.starts_with('d') {
            if name.trim_end_matches('/') == "home/nonroot" {
                assert_eq!(owner, "65532/65532", "{line}");
            }
            continue;
        }
        files.push(name.to_owned());
    }
    for file in &files {
        assert!(
            ["farm-apiserver", "etc/passwd", "etc/group"].contains(&file.as_str())
                || libraries.contains(file),
            "{file} is in the image but not in the Dockerfile's"
        );
    }
    for lib in &libraries {
        assert!(files.contains(lib), "{lib} is linked but not in the image");
    }
    let passwd = tar(&["-xOf", layer.to_str().unwrap(), "etc/passwd"]);
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
}
