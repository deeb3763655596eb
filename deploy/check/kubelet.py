#!/usr/bin/env python3
"""Runs the containers of a rendered chart as a kubelet would start them,
and every warren part among them with --check-config.

    kubelet.py --warren BIN --namespace NS [--fixtures SECRETS.yaml] RENDERED.yaml...

For each pod template (Jobs first, as Helm runs hooks before the rest), in
order: its volumes are made as the kubelet makes them (a Secret's or
ConfigMap's keys as files, with their modes and owner, group-readable under
an fsGroup; emptyDirs; hostPaths as empty directories, except the
machine's own /dev, /sys and /proc, which stay the machine's), its
environment is resolved (values, Secrets, ConfigMaps, the downward API with
a made-up node name and pod address) and `$(VAR)` expanded in the command
and arguments; then each container runs in a private mount namespace with
its volumes at their mount paths, the `warren` binary at the image's path,
as its user and with its capabilities (`privileged`, or the bounding set
its `capabilities` leave):

- a warren part (`<binary> scheduler|gateway|node ...`) with
  `--check-config` appended: it must exit 0 (what it prints is shown);
- another container of the warren image: init containers run as they are
  (the node's certificate, the hook Job's `warren certs`), long-running
  ones are only syntax-checked (`sh -n`);
- a container of another image (kubectl) is syntax-checked only; a hook
  Job's `put NAME --from-file=KEY=PATH` lines are carried out as the
  Secrets they would store.

Secrets come from the render, from cert-manager Certificates (issued here:
a CA Certificate with `warren certs init`, its Issuer's leaf Certificates
with `warren certs issue` for the role and name of their `warren://` URI,
any other one self-signed for its DNS names with openssl), from a
CloudNativePG Cluster (`<name>-app`), from hook Jobs, and from --fixtures
(the Secrets a release's values name as existing). A Secret a pod needs
and none of these has fails the check, as the pod would not start.

Not checked here: what the kubelet alone decides (probes, resources,
readOnlyRootFilesystem, seccomp), and the CRDs' schemas.
"""

import argparse
import base64
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import private_root  # noqa: E402

NODE_NAME = "ip-10-0-3-7.ec2.internal"
POD_IP = "10.0.3.7"
HOST_IP = "10.0.0.7"
MACHINE_PATHS = ("/dev", "/sys", "/proc")
PARTS = ("scheduler", "gateway", "node")


class Failure(Exception):
    pass


def b64(s):
    return base64.b64decode(s)


class Cluster:
    """What the API server would hold: Secrets and ConfigMaps."""

    def __init__(self, warren, namespace, work):
        self.warren = warren
        self.namespace = namespace
        self.work = work
        self.secrets = {}
        self.configmaps = {}
        self.issuers = {}  # Issuer name -> CA Secret name (or None: self-signed)

    def add_secret(self, name, data, origin):
        self.secrets[name] = (data, origin)

    def load(self, doc):
        kind = doc.get("kind")
        meta = doc.get("metadata", {})
        name = meta.get("name")
        if kind == "Secret":
            data = {k: b64(v) for k, v in (doc.get("data") or {}).items()}
            data.update({k: v.encode() for k, v in (doc.get("stringData") or {}).items()})
            self.add_secret(name, data, "rendered")
        elif kind == "ConfigMap":
            self.configmaps[name] = {k: v.encode() for k, v in (doc.get("data") or {}).items()}
        elif kind == "Issuer":
            spec = doc.get("spec", {})
            self.issuers[name] = (spec.get("ca") or {}).get("secretName")

    def certificates(self, docs):
        """Issues what cert-manager would: CAs first, then the rest."""
        certs = [d for d in docs if d.get("kind") == "Certificate"]
        for cert in sorted(certs, key=lambda c: not c["spec"].get("isCA", False)):
            self.issue(cert)

    def issue(self, cert):
        spec = cert["spec"]
        secret = spec["secretName"]
        d = tempfile.mkdtemp(dir=self.work, prefix="cert-")
        if spec.get("isCA"):
            sh([self.warren, "certs", "init", "--dir", d, "--days", "30"])
            ca = read(f"{d}/ca.pem")
            self.add_secret(secret, {"tls.crt": ca, "tls.key": read(f"{d}/ca.key"), "ca.crt": ca},
                            "cert-manager (CA)")
            return
        issuer = spec["issuerRef"]
        ca_secret = self.issuers.get(issuer["name"]) if issuer.get("kind", "Issuer") == "Issuer" else None
        uris = [u for u in spec.get("uris", []) if u.startswith("warren://")]
        if ca_secret and uris:
            role, name = uris[0][len("warren://"):].split("/", 1)
            data, _ = self.secrets[ca_secret]
            with open(f"{d}/ca.pem", "wb") as f:
                f.write(data["tls.crt"])
            with open(os.open(f"{d}/ca.key", os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                f.write(data["tls.key"])
            hosts = []
            for h in spec.get("dnsNames", []) + spec.get("ipAddresses", []):
                hosts += ["--host", h]
            sh([self.warren, "certs", "issue", "--dir", d, "--role", role, "--name", name,
                "--days", "30"] + hosts)
            self.add_secret(secret, {"tls.crt": read(f"{d}/{role}-{name}.pem"),
                                     "tls.key": read(f"{d}/{role}-{name}.key"),
                                     "ca.crt": data["tls.crt"]}, f"cert-manager ({issuer['name']})")
            return
        # An outside issuer (the public wildcard): self-signed for its names.
        names = spec.get("dnsNames", [])
        san = ",".join(f"DNS:{n}" for n in names)
        sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-keyout", f"{d}/tls.key", "-out", f"{d}/tls.crt", "-days", "30",
            "-subj", f"/CN={names[0] if names else 'warren'}", "-addext", f"subjectAltName={san}"])
        self.add_secret(secret, {"tls.crt": read(f"{d}/tls.crt"), "tls.key": read(f"{d}/tls.key")},
                        f"cert-manager ({issuer['name']}, self-signed here)")

    def cnpg(self, doc):
        name = doc["metadata"]["name"]
        init = doc["spec"]["bootstrap"]["initdb"]
        owner, db = init["owner"], init["database"]
        uri = f"postgresql://{owner}:ci-password@{name}-rw.{self.namespace}:5432/{db}"
        self.add_secret(f"{name}-app", {"uri": uri.encode(), "username": owner.encode(),
                                        "password": b"ci-password"}, "CloudNativePG")


def read(path):
    with open(path, "rb") as f:
        return f.read()


def sh(argv):
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        raise Failure(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p.stdout


def expand(s, env):
    """The kubelet's $(VAR) expansion: defined variables replaced, $$ kept as $."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, s)


class Pod:
    def __init__(self, cluster, workload, template, image, binary):
        self.cluster = cluster
        self.workload = workload
        self.spec = template["spec"]
        self.labels = template.get("metadata", {}).get("labels", {})
        self.image = image
        self.binary = binary
        self.dir = tempfile.mkdtemp(dir=cluster.work, prefix=f"pod-{workload}-")
        self.volumes = {}
        self.fields = {
            "metadata.name": f"{workload}-ci",
            "metadata.namespace": cluster.namespace,
            "spec.nodeName": NODE_NAME,
            "spec.serviceAccountName": self.spec.get("serviceAccountName", "default"),
            "status.podIP": POD_IP,
            "status.hostIP": HOST_IP,
        }

    def secret(self, name, why):
        if name not in self.cluster.secrets:
            raise Failure(f"{self.workload}: Secret {name!r} ({why}) does not exist: the pod would not start")
        return self.cluster.secrets[name][0]

    def make_volumes(self):
        fs_group = (self.spec.get("securityContext") or {}).get("fsGroup")
        for v in self.spec.get("volumes", []):
            name = v["name"]
            path = os.path.join(self.dir, "volumes", name)
            if "secret" in v or "configMap" in v:
                src = v.get("secret") or v.get("configMap")
                if "secret" in v:
                    data = self.secret(src["secretName"], f"volume {name}")
                    mode = src.get("defaultMode", 0o644)
                else:
                    if src["name"] not in self.cluster.configmaps:
                        raise Failure(f"{self.workload}: ConfigMap {src['name']!r} does not exist")
                    data = self.cluster.configmaps[src["name"]]
                    mode = src.get("defaultMode", 0o644)
                items = src.get("items") or [{"key": k, "path": k} for k in data]
                os.makedirs(path)
                os.chmod(path, 0o755)
                for item in items:
                    if item["key"] not in data:
                        raise Failure(f"{self.workload}: volume {name}: no key {item['key']!r}")
                    f = os.path.join(path, item["path"])
                    os.makedirs(os.path.dirname(f), exist_ok=True)
                    with open(f, "wb") as out:
                        out.write(data[item["key"]])
                    m = item.get("mode", mode)
                    if fs_group is not None:
                        # As the kubelet's volume ownership: group fsGroup, readable by it.
                        os.chown(f, 0, fs_group)
                        m |= 0o440
                    else:
                        os.chown(f, 0, 0)
                    os.chmod(f, m)
                self.volumes[name] = path
            elif "emptyDir" in v:
                os.makedirs(path)
                os.chmod(path, 0o777)
                self.volumes[name] = path
            elif "hostPath" in v:
                host = v["hostPath"]["path"]
                if host.startswith(MACHINE_PATHS):
                    self.volumes[name] = None  # the machine's own, as it is
                else:
                    os.makedirs(path)
                    self.volumes[name] = path
            else:
                raise Failure(f"{self.workload}: volume {name}: a kind this check does not make")

    def env(self, c):
        env = {}
        for ref in c.get("envFrom", []):
            if "secretRef" in ref:
                for k, v in self.secret(ref["secretRef"]["name"], "envFrom").items():
                    env[k] = v.decode()
            elif "configMapRef" in ref:
                env.update({k: v.decode() for k, v in self.cluster.configmaps[ref["configMapRef"]["name"]].items()})
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(str(e["value"]), env)
            elif "valueFrom" in e:
                vf = e["valueFrom"]
                if "fieldRef" in vf:
                    env[e["name"]] = self.fields[vf["fieldRef"]["fieldPath"]]
                elif "secretKeyRef" in vf:
                    ref = vf["secretKeyRef"]
                    data = self.secret(ref["name"], f"env {e['name']}")
                    if ref["key"] not in data:
                        raise Failure(f"{self.workload}: Secret {ref['name']!r} has no key {ref['key']!r} (env {e['name']})")
                    env[e["name"]] = data[ref["key"]].decode()
                elif "configMapKeyRef" in vf:
                    ref = vf["configMapKeyRef"]
                    env[e["name"]] = self.cluster.configmaps[ref["name"]][ref["key"]].decode()
                else:
                    env[e["name"]] = "0"
            else:
                env[e["name"]] = ""
        return env

    def mounts(self, c):
        mounts = []
        for m in c.get("volumeMounts", []):
            src = self.volumes.get(m["name"], "missing")
            if src == "missing":
                raise Failure(f"{self.workload}/{c['name']}: mounts volume {m['name']!r}, which the pod does not have")
            if src is None:
                continue
            if m.get("subPath"):
                src = os.path.join(src, m["subPath"])
            mounts.append((src, m["mountPath"]))
        # The image: the warren binary where the chart says it is.
        if c.get("image") == self.image:
            mounts.append((os.path.abspath(self.cluster.warren), self.binary))
        return mounts

    def identity(self, c):
        pod_sc = self.spec.get("securityContext") or {}
        sc = c.get("securityContext") or {}
        uid = sc.get("runAsUser", pod_sc.get("runAsUser", 0))
        gid = sc.get("runAsGroup", pod_sc.get("runAsGroup", 0))
        groups = [pod_sc["fsGroup"]] if "fsGroup" in pod_sc else []
        groups += pod_sc.get("supplementalGroups", [])
        if sc.get("privileged"):
            caps = "all"
        else:
            cap = sc.get("capabilities") or {}
            drop = [d.upper() for d in cap.get("drop", [])]
            add = [a.upper() for a in cap.get("add", [])]
            if "ALL" in drop:
                caps = add
            else:
                caps = "all"  # the runtime's default set; not narrowed here
        return uid, gid, groups, caps

    def run(self, c, init):
        env = self.env(c)
        argv = [expand(a, env) for a in (c.get("command") or []) + (c.get("args") or [])]
        if not argv:
            raise Failure(f"{self.workload}/{c['name']}: no command (the image's entrypoint is not checked)")
        uid, gid, groups, caps = self.identity(c)
        what = f"{self.workload}/{c['name']}"
        ours = c.get("image") == self.image
        is_part = ours and argv[0] == self.binary and len(argv) > 1 and argv[1] in PARTS
        shell = os.path.basename(argv[0]) in ("sh", "bash")
        if is_part:
            argv = argv + ["--check-config"]
            mode = "check"
        elif ours and init:
            mode = "run"
        elif shell:
            mode = "syntax"
        else:
            print(f"  {what}: not run ({c.get('image')}: {argv[0]})")
            return env
        if mode == "syntax":
            script_args = argv[1:]
            if script_args and script_args[0] == "-c":
                p = subprocess.run([argv[0], "-n", "-c", script_args[1]], capture_output=True, text=True)
            else:
                p = subprocess.run([argv[0], "-n"] + self.resolve(c, script_args[:1]), capture_output=True, text=True)
            if p.returncode != 0:
                raise Failure(f"{what}: {argv[0]} -n: {p.stderr.strip()}")
            print(f"  {what}: script syntax ok ({c.get('image')}; long-running or not the warren image: not run)")
            if self.spec.get("restartPolicy") == "Never" and not init:
                self.carry_out_puts(c, env)
            return env
        scratch = os.path.join(self.dir, "scratch-" + c["name"])
        rc, out, err = private_root.run(argv, env, self.mounts(c), scratch, uid, gid, groups, caps,
                                        workdir=c.get("workingDir"))
        shown = " ".join(shlex.quote(a) for a in argv)
        if rc != 0:
            raise Failure(f"{what}: exit {rc}: {shown}\n{err.strip()}\n{out.strip()}")
        print(f"  {what}: {'config checked' if mode == 'check' else 'ran'}: {shown}")
        for line in out.strip().splitlines():
            print(f"    | {line}")
        return env

    def resolve(self, c, paths):
        """A script path inside the container, as a path on the machine."""
        out = []
        for p in paths:
            for src, target in self.mounts(c):
                if p.startswith(target.rstrip("/") + "/"):
                    p = os.path.join(src, p[len(target.rstrip("/")) + 1:])
                    break
            out.append(p)
        return out

    def carry_out_puts(self, c, env):
        """A hook Job's `put NAME --from-file=KEY=PATH ...` lines (kubectl
        creating Secrets), carried out as the Secrets they store."""
        argv = (c.get("command") or []) + (c.get("args") or [])
        script = argv[-1].replace("\\\n", " ")
        for line in script.splitlines():
            words = shlex.split(line.strip()) if line.strip().startswith("put ") else []
            if len(words) < 2:
                continue
            name = expand_shell(words[1], env)
            data = {}
            for w in words[2:]:
                if w.startswith("--from-file="):
                    key, path = expand_shell(w[len("--from-file="):], env).split("=", 1)
                    data[key] = read(self.resolve(c, [path])[0])
            self.cluster.add_secret(name, data, f"hook Job {self.workload}")
            print(f"  {self.workload}/{c['name']}: stores Secret {name} ({', '.join(sorted(data))})")


def expand_shell(s, env):
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), m.group(0)), s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warren", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--fixtures")
    ap.add_argument("--image", help="the warren image (default: the scheduler's)")
    ap.add_argument("--binary", default="/usr/local/bin/warren")
    ap.add_argument("rendered", nargs="+")
    a = ap.parse_args()
    docs = []
    for f in a.rendered:
        with open(f) as fh:
            docs += [d for d in yaml.safe_load_all(fh) if d]
    work = tempfile.mkdtemp(prefix="warren-kubelet-")
    try:
        cluster = Cluster(a.warren, a.namespace, work)
        if a.fixtures:
            with open(a.fixtures) as fh:
                for d in yaml.safe_load_all(fh):
                    if d:
                        cluster.load(d)
                        if d.get("kind") == "Secret":
                            cluster.secrets[d["metadata"]["name"]] = (cluster.secrets[d["metadata"]["name"]][0], "fixture")
        for d in docs:
            cluster.load(d)
        cluster.certificates(docs)
        for d in docs:
            if d.get("kind") == "Cluster" and d.get("apiVersion", "").startswith("postgresql.cnpg.io/"):
                cluster.cnpg(d)
        workloads = [d for d in docs if d.get("kind") in ("Deployment", "DaemonSet", "StatefulSet", "Job")]
        image = a.image
        if not image:
            for d in workloads:
                for c in d["spec"]["template"]["spec"]["containers"]:
                    if (c.get("command") or [None])[0] == a.binary:
                        image = c["image"]
                        break
                if image:
                    break
        # Hooks (Jobs) first, as Helm runs them before the release's resources.
        workloads.sort(key=lambda d: d["kind"] != "Job")
        checked = 0
        for d in workloads:
            name = f"{d['kind']}/{d['metadata']['name']}"
            print(name)
            pod = Pod(cluster, d["metadata"]["name"], d["spec"]["template"], image, a.binary)
            pod.make_volumes()
            for c in pod.spec.get("initContainers", []):
                pod.run(c, init=True)
            for c in pod.spec["containers"]:
                env = (c.get("command") or []) + (c.get("args") or [])
                pod.run(c, init=False)
                if env and env[0] == a.binary and len(env) > 1 and env[1] in PARTS:
                    checked += 1
        if checked == 0:
            raise Failure("no warren part in the render: nothing was checked")
        print(f"kubelet.py: {checked} part container(s) passed --check-config; Secrets: "
              + ", ".join(f"{k} ({v[1]})" for k, v in sorted(cluster.secrets.items())))
    except Failure as e:
        print(f"kubelet.py: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
