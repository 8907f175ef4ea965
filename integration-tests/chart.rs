//! The Helm chart (helm/streamstate) renders what production needs: a restricted pod that
//! runs with a read-only root filesystem, probes on the admin port, PVC templates for state
//! and checkpoints, a `checksum/config` that is the ConfigMap's hash, and a streamstate.toml
//! that `streamstate check-config` accepts, for the defaults and every ci/ values file.
//!
//! Needs the helm binary in `STREAMSTATE_HELM` (integration-tests/run.sh installs it through
//! integration-tests/chart/check.sh and exports it). No cluster, no broker.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

const BIN: &str = env!("CARGO_BIN_EXE_streamstate");
/// The chart's floor: the pod-index label that becomes `job.instance` needs Kubernetes 1.28.
const KUBE_VERSION: &str = "1.28.0";

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("helm/streamstate")
}

fn helm() -> String {
    std::env::var("STREAMSTATE_HELM").unwrap_or_else(|_| {
        panic!(
            "STREAMSTATE_HELM is not set: point it at a helm binary, e.g. \
             STREAMSTATE_HELM=$(integration-tests/chart/check.sh --tools-only | tail -n1) \
             (integration-tests/run.sh does this)"
        )
    })
}

/// `helm template` with extra arguments; every rendered object as JSON.
fn render(args: &[&str]) -> Vec<Value> {
    let out = Command::new(helm())
        .args([
            "template",
            "ss",
            "--namespace",
            "streamstate",
            "--kube-version",
            KUBE_VERSION,
        ])
        .arg(chart())
        .args(args)
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "helm template {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} rendered"))
}

fn statefulset(objects: &[Value]) -> &Value {
    object(objects, "StatefulSet", "ss-streamstate")
}

fn config_toml(objects: &[Value]) -> String {
    object(objects, "ConfigMap", "ss-streamstate")["data"]["streamstate.toml"]
        .as_str()
        .expect("streamstate.toml")
        .to_string()
}

fn checksum(objects: &[Value]) -> String {
    statefulset(objects)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        .as_str()
        .expect("checksum/config annotation")
        .to_string()
}

/// `streamstate check-config` on a rendered TOML, with the Secret's token file replaced by a
/// temp file and the pod's environment (`STREAMSTATE__JOB__INSTANCE` from the pod index).
fn check_config(toml: &str, env: &[(&str, &str)]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("admin-token");
    std::fs::write(&token, "t0ken\n").expect("write token");
    let token_line = toml
        .lines()
        .find(|l| l.starts_with("token_file = "))
        .expect("token_file in the rendered config");
    let toml = toml.replace(
        token_line,
        &format!("token_file = {:?}", token.display().to_string()),
    );
    let path = dir.path().join("streamstate.toml");
    std::fs::write(&path, toml).expect("write config");
    let mut cmd = Command::new(BIN);
    cmd.args(["check-config", "--config"])
        .arg(&path)
        .env("RUST_LOG", "off");
    cmd.env("STREAMSTATE__JOB__INSTANCE", "2")
        .env("STREAMSTATE__JOB__INSTANCES", "3");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run streamstate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn values_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart().join("ci"))
        .expect("helm/streamstate/ci")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 3,
        "expected at least 3 ci values files, found {files:?}"
    );
    files
}

#[test]
fn pod_runs_restricted_with_a_read_only_root_filesystem() {
    let objects = render(&[]);
    let pod = &statefulset(&objects)["spec"]["template"]["spec"];
    let psc = &pod["securityContext"];
    assert_eq!(psc["runAsNonRoot"], true, "{psc}");
    assert_eq!(psc["runAsUser"], 10001, "{psc}");
    assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault", "{psc}");
    assert_eq!(pod["automountServiceAccountToken"], false);
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1);
    let sc = &containers[0]["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true, "{sc}");
    assert_eq!(sc["runAsUser"], 10001, "{sc}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{sc}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{sc}");
    assert_eq!(
        sc["capabilities"]["drop"],
        serde_json::json!(["ALL"]),
        "{sc}"
    );
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{sc}");
    assert!(
        sc["capabilities"]["add"].is_null(),
        "no capability may be added: {sc}"
    );
}

#[test]
fn probes_hit_livez_and_readyz_on_the_admin_port() {
    let objects = render(&[]);
    let container = &statefulset(&objects)["spec"]["template"]["spec"]["containers"][0];
    let port = container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "admin")
        .expect("admin port");
    assert_eq!(port["containerPort"], 9464);
    for (probe, path) in [
        ("startupProbe", "/livez"),
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
    ] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}: {}", container[probe]);
        assert_eq!(get["port"], "admin", "{probe}: {}", container[probe]);
    }
    // The admin listener in the config is the port the probes and Services use.
    assert!(
        config_toml(&objects).contains("listen = \"0.0.0.0:9464\""),
        "{}",
        config_toml(&objects)
    );
    let moved = render(&["--set", "admin.port=9555"]);
    let container = &statefulset(&moved)["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["ports"][0]["containerPort"], 9555);
    assert!(
        config_toml(&moved).contains("listen = \"0.0.0.0:9555\""),
        "{}",
        config_toml(&moved)
    );
}

#[test]
fn state_and_checkpoints_live_on_claim_templates_the_config_points_at() {
    let objects = render(&[]);
    let sts = statefulset(&objects);
    let claims = sts["spec"]["volumeClaimTemplates"]
        .as_array()
        .expect("volumeClaimTemplates");
    let claim = |name: &str| {
        claims
            .iter()
            .find(|c| c["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {name} claim"))
    };
    assert_eq!(
        claim("state")["spec"]["resources"]["requests"]["storage"],
        "10Gi"
    );
    assert_eq!(
        claim("state")["spec"]["accessModes"],
        serde_json::json!(["ReadWriteOnce"])
    );
    assert_eq!(
        claim("checkpoints")["spec"]["resources"]["requests"]["storage"],
        "20Gi"
    );
    let mounts = sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts");
    let mount = |name: &str| {
        mounts
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no {name} mount"))["mountPath"]
            .clone()
    };
    assert_eq!(mount("state"), "/var/lib/streamstate/state");
    assert_eq!(mount("checkpoints"), "/var/lib/streamstate/checkpoints");
    let toml = config_toml(&objects);
    assert!(
        toml.contains("dir = \"/var/lib/streamstate/state\""),
        "{toml}"
    );
    assert!(
        toml.contains("storage = \"file:///var/lib/streamstate/checkpoints\""),
        "{toml}"
    );
    // The instance id is the pod index, through the Downward API (no shell in the image).
    let env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env");
    let instance = env
        .iter()
        .find(|e| e["name"] == "STREAMSTATE__JOB__INSTANCE")
        .expect("STREAMSTATE__JOB__INSTANCE");
    assert_eq!(
        instance["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.labels['apps.kubernetes.io/pod-index']"
    );

    // S3 checkpoints: no checkpoint claim, state claim as configured.
    let s3 = render(&[
        "-f",
        chart()
            .join("ci/s3-three-replicas-values.yaml")
            .to_str()
            .expect("path"),
    ]);
    let claims = statefulset(&s3)["spec"]["volumeClaimTemplates"]
        .as_array()
        .expect("claims")
        .clone();
    let names: Vec<_> = claims
        .iter()
        .map(|c| c["metadata"]["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["state"]);
    assert_eq!(claims[0]["spec"]["storageClassName"], "fast-ssd");
    assert_eq!(statefulset(&s3)["spec"]["replicas"], 3);
}

#[test]
fn grace_period_covers_the_final_checkpoint() {
    let grace = |args: &[&str]| {
        statefulset(&render(args))["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            .as_i64()
            .expect("grace")
    };
    // interval 1s + timeout 30s + margin 30s.
    assert_eq!(grace(&[]), 61);
    assert_eq!(
        grace(&[
            "--set",
            "config.checkpoint.timeout=2m",
            "--set",
            "config.kafka.transaction_timeout=5m"
        ]),
        1 + 120 + 30
    );
    assert_eq!(
        grace(&["--set", "config.checkpoint.interval=1500ms"]),
        2 + 30 + 30
    );
}

#[test]
fn config_checksum_is_the_sha256_of_the_rendered_config_and_follows_values() {
    let objects = render(&[]);
    let toml = config_toml(&objects);
    let sha = hex::encode(Sha256::digest(toml.as_bytes()));
    assert_eq!(
        checksum(&objects),
        sha,
        "checksum/config must be the sha256 of the ConfigMap's streamstate.toml"
    );
    let changed = render(&["--set", "config.checkpoint.interval=2s"]);
    assert_ne!(config_toml(&changed), toml);
    assert_eq!(
        checksum(&changed),
        hex::encode(Sha256::digest(config_toml(&changed).as_bytes()))
    );
    assert_ne!(
        checksum(&changed),
        checksum(&objects),
        "a config change must roll the pods"
    );
    // Values outside the config (replicas, resources) leave it alone.
    assert_eq!(
        checksum(&render(&["--set", "resources.requests.cpu=2"])),
        checksum(&objects)
    );
}

#[test]
fn check_config_accepts_the_rendered_config_of_every_values_file() {
    let (ok, out) = check_config(&config_toml(&render(&[])), &[]);
    assert!(ok && out.contains("config ok"), "defaults: {out}");
    for file in values_files() {
        let objects = render(&[
            "-f",
            file.to_str().expect("path"),
            "--api-versions",
            "monitoring.coreos.com/v1",
        ]);
        let toml = config_toml(&objects);
        // As the pod gets them from the Secret (dots stay part of the librdkafka name).
        let mut env = vec![
            ("STREAMSTATE__KAFKA__PROPERTIES__SASL.USERNAME", "user"),
            ("STREAMSTATE__KAFKA__PROPERTIES__SASL.PASSWORD", "0123"),
        ];
        // The registry password comes from the Secret too, for a config with a registry.
        if toml.contains("[schema_registry]") {
            env.push(("STREAMSTATE__SCHEMA_REGISTRY__PASSWORD", "0456"));
        }
        let (ok, out) = check_config(&toml, &env);
        assert!(
            ok && out.contains("config ok"),
            "{}: check-config refused the rendered config: {out}\n{toml}",
            file.display()
        );
    }
}

#[test]
fn check_config_refuses_a_rendered_config_the_schema_cannot_judge() {
    // Schema-valid values whose combination the binary refuses: the test above would catch
    // a chart that renders nonsense.
    let toml = config_toml(&render(&["--set", "config.kafka.transaction_timeout=20s"]));
    let (ok, out) = check_config(&toml, &[]);
    assert!(
        !ok,
        "check-config accepted transaction_timeout < interval + timeout:\n{toml}"
    );
    assert!(out.contains("kafka.transaction_timeout"), "{out}");
}

#[test]
fn existing_secret_and_sasl_credentials_come_from_the_secret() {
    let file = chart().join("ci/existing-secret-sasl-ssl-values.yaml");
    let objects = render(&["-f", file.to_str().expect("path")]);
    assert!(
        !objects.iter().any(|o| o["kind"] == "Secret"),
        "existingSecret: the chart must not create a Secret"
    );
    let pod = &statefulset(&objects)["spec"]["template"]["spec"];
    let secret_volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "secrets")
        .expect("secrets volume");
    assert_eq!(
        secret_volume["secret"]["secretName"],
        "fraud-rules-credentials"
    );
    let env = pod["containers"][0]["env"].as_array().expect("env");
    let password = env
        .iter()
        .find(|e| e["name"] == "STREAMSTATE__KAFKA__PROPERTIES__SASL.PASSWORD")
        .expect("SASL password env");
    assert_eq!(
        password["valueFrom"]["secretKeyRef"]["name"],
        "fraud-rules-credentials"
    );
    assert_eq!(
        password["valueFrom"]["secretKeyRef"]["key"],
        "kafka-sasl-password"
    );
    let toml = config_toml(&objects);
    assert!(
        toml.contains("\"security.protocol\" = \"SASL_SSL\""),
        "{toml}"
    );
    assert!(
        !toml.contains("sasl.password"),
        "no credential in the ConfigMap: {toml}"
    );
    assert!(
        toml.contains("token_file = \"/etc/streamstate/secrets/admin-token\""),
        "{toml}"
    );
}

#[test]
fn chart_ships_the_repository_dashboard_and_alerts_verbatim() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in ["streamstate.json", "alerts.yaml"] {
        let repo = std::fs::read(root.join("dashboards").join(file)).expect("repository copy");
        let chart = std::fs::read(chart().join("dashboards").join(file)).expect("chart copy");
        assert!(
            repo == chart,
            "helm/streamstate/dashboards/{file} differs from dashboards/{file}: copy it over"
        );
    }
    let objects = render(&[
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "grafanaDashboard.enabled=true",
        "--api-versions",
        "monitoring.coreos.com/v1",
    ]);
    let rule = objects
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    let alerts: Value = serde_yaml::from_slice(
        &std::fs::read(root.join("dashboards/alerts.yaml")).expect("alerts"),
    )
    .expect("yaml");
    assert_eq!(
        rule["spec"], alerts,
        "the PrometheusRule's spec is dashboards/alerts.yaml"
    );
    let dashboard = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["data"]["streamstate.json"].is_string());
    let shipped: Value = serde_json::from_str(
        dashboard.expect("dashboard ConfigMap")["data"]["streamstate.json"]
            .as_str()
            .expect("json"),
    )
    .expect("dashboard JSON");
    let repo: Value = serde_json::from_slice(
        &std::fs::read(root.join("dashboards/streamstate.json")).expect("dashboard"),
    )
    .expect("json");
    assert_eq!(
        shipped, repo,
        "the dashboard ConfigMap holds dashboards/streamstate.json"
    );
}

#[test]
fn check_restore_hook_is_off_by_default_and_checks_every_instance_before_an_upgrade() {
    let hook = "ss-streamstate-check-restore";
    assert!(
        !render(&[]).iter().any(|o| o["metadata"]["name"] == hook),
        "off by default"
    );
    let file = chart().join("ci/check-restore-values.yaml");
    let objects = render(&["-f", file.to_str().expect("path")]);
    let job = object(&objects, "Job", hook);
    assert_eq!(
        job["metadata"]["annotations"]["helm.sh/hook"],
        "pre-upgrade"
    );
    // Its own ConfigMap with the NEW config (the chart's still holds the old one pre-upgrade).
    let config = object(&objects, "ConfigMap", hook);
    assert_eq!(
        config["metadata"]["annotations"]["helm.sh/hook"],
        "pre-upgrade"
    );
    assert_eq!(
        config["data"]["streamstate.toml"],
        config_toml(&objects).as_str()
    );
    let pod = &job["spec"]["template"]["spec"];
    assert!(
        pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v["configMap"]["name"] == hook)
    );
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 2, "one check per instance");
    for (i, c) in containers.iter().enumerate() {
        let args: Vec<&str> = c["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("arg"))
            .collect();
        assert!(
            args.contains(&"check-restore") && args.contains(&"--from=latest"),
            "{args:?}"
        );
        assert!(
            args.contains(&format!("--instance={i}").as_str()),
            "{args:?}"
        );
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    }
    // The rendered hook config is one check-restore accepts.
    let (ok, text) = check_config(
        config["data"]["streamstate.toml"].as_str().expect("toml"),
        &[],
    );
    assert!(ok, "{text}");
    // Refused where the hook could not read the checkpoints (per-pod ReadWriteOnce volumes).
    let out = Command::new(helm())
        .args(["template", "ss", "--kube-version", KUBE_VERSION])
        .arg(chart())
        .args(["--set", "checkRestore.enabled=true"])
        .output()
        .expect("run helm");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("checkRestore.enabled needs checkpoint storage")
    );
}

#[test]
fn replica_count_is_the_instance_count_and_a_rescale_starts_from_the_set() {
    let file = chart().join("ci/s3-three-replicas-values.yaml");
    let objects = render(&[
        "-f",
        file.to_str().expect("path"),
        "--api-versions",
        "monitoring.coreos.com/v1",
    ]);
    let sts = statefulset(&objects);
    assert_eq!(sts["spec"]["replicas"], 3);
    let container = &sts["spec"]["template"]["spec"]["containers"][0];
    let env = container["env"].as_array().expect("env");
    let instances = env
        .iter()
        .find(|e| e["name"] == "STREAMSTATE__JOB__INSTANCES")
        .expect("STREAMSTATE__JOB__INSTANCES");
    assert_eq!(instances["value"], "3");
    let args: Vec<&str> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.contains(&"--from-savepoint-set=scale-to-3"),
        "{args:?}"
    );
    // The rendered config with the pod's environment is one every instance accepts.
    let (ok, text) = check_config(
        &config_toml(&objects),
        &[("STREAMSTATE__JOB__INSTANCES", "3")],
    );
    assert!(ok, "{text}");
}

#[test]
fn peer_url_names_every_pod_through_the_headless_service() {
    let objects = render(&[]);
    let sts = statefulset(&objects);
    let pod_prefix = sts["metadata"]["name"].as_str().expect("name");
    let service = sts["spec"]["serviceName"].as_str().expect("serviceName");
    let headless = object(&objects, "Service", service);
    assert_eq!(
        headless["spec"]["clusterIP"], "None",
        "{service} is headless"
    );
    let port = headless["spec"]["ports"][0]["port"]
        .as_u64()
        .expect("admin port");
    let expected =
        format!("peer_url = \"http://{pod_prefix}-{{instance}}.{service}.streamstate.svc:{port}\"");
    let toml = config_toml(&objects);
    assert!(toml.contains(&expected), "{expected} in {toml}");
}

#[test]
fn repartition_mode_is_rendered_only_when_set_and_the_service_accepts_it() {
    let plain = config_toml(&render(&[]));
    assert!(!plain.contains("repartition"), "{plain}");
    let objects = render(&["--set", "config.job.repartition=true"]);
    let toml = config_toml(&objects);
    assert!(toml.contains("\nrepartition = true\n"), "{toml}");
    let (ok, text) = check_config(&toml, &[]);
    assert!(ok, "{text}");
}
