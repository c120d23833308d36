//! Where a kind keeps what the projector edits: a [`Mapping`] of fixed paths to the pod
//! template's annotations and volumes, and paths to its containers and their lists; the
//! built-in kinds' mappings and the `PodSpec`-able default.

use super::path::{Path, PathError};

/// Where a kind keeps what the projector edits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// A fixed path to the pod template's annotations (a map).
    pub annotations: Path,
    /// A fixed path to the pod's volumes (a list).
    pub volumes: Path,
    /// Where containers are.
    pub containers: Vec<ContainerMapping>,
}

/// Where containers are, and where each keeps its lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerMapping {
    /// A path (wildcards allowed) matching each container.
    pub path: Path,
    /// A fixed path, within a container, to its name; without one, every container is bound.
    pub name: Option<Path>,
    /// A fixed path, within a container, to its `env` list.
    pub env: Path,
    /// A fixed path, within a container, to its `envFrom` list.
    pub env_from: Path,
    /// A fixed path, within a container, to its `volumeMounts` list.
    pub volume_mounts: Path,
}

/// A container mapping as text, each `None` meaning the default of a real `Container`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ContainerPaths<'a> {
    /// The JSONPath matching the containers.
    pub path: &'a str,
    /// The name's fixed path (no default: without one, containers are not filtered).
    pub name: Option<&'a str>,
    /// `env`'s fixed path (default `.env`).
    pub env: Option<&'a str>,
    /// `envFrom`'s fixed path (default `.envFrom`).
    pub env_from: Option<&'a str>,
    /// `volumeMounts`' fixed path (default `.volumeMounts`).
    pub volume_mounts: Option<&'a str>,
}

impl ContainerMapping {
    /// Parses `paths`.
    pub fn parse(paths: &ContainerPaths<'_>) -> Result<ContainerMapping, PathError> {
        let fixed = |p: Option<&str>, default: &str| Path::parse_fixed(p.unwrap_or(default));
        Ok(ContainerMapping {
            path: Path::parse(paths.path)?,
            name: paths.name.map(Path::parse_fixed).transpose()?,
            env: fixed(paths.env, ".env")?,
            env_from: fixed(paths.env_from, ".envFrom")?,
            volume_mounts: fixed(paths.volume_mounts, ".volumeMounts")?,
        })
    }
}

impl Mapping {
    /// The mapping of a kind whose `PodTemplateSpec` is at the fixed path `template`:
    /// containers and init containers, named by `.name`.
    pub fn pod_template(template: &str) -> Result<Mapping, PathError> {
        let template = Path::parse_fixed(template)?;
        let at = |rest: &str| template.join(&Path::parse(rest).expect("a valid path"));
        let container = |list: &str| ContainerMapping {
            path: at(list),
            name: Some(Path::parse_fixed(".name").expect("a valid path")),
            env: Path::parse_fixed(".env").expect("a valid path"),
            env_from: Path::parse_fixed(".envFrom").expect("a valid path"),
            volume_mounts: Path::parse_fixed(".volumeMounts").expect("a valid path"),
        };
        Ok(Mapping {
            annotations: at(".metadata.annotations"),
            volumes: at(".spec.volumes"),
            containers: vec![
                container(".spec.containers[*]"),
                container(".spec.initContainers[*]"),
            ],
        })
    }

    /// The mapping of a `PodSpec`-able kind: its template at `.spec.template`.
    pub fn pod_spec_able() -> Mapping {
        Mapping::pod_template(".spec.template").expect("a valid path")
    }

    /// The built-in mapping of the kind `kind` of API group `group` (`""` for the core group):
    /// Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job and CronJob.
    pub fn builtin(group: &str, kind: &str) -> Option<Mapping> {
        match (group, kind) {
            ("apps", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet")
            | ("batch", "Job")
            | ("", "ReplicationController") => Some(Mapping::pod_spec_able()),
            ("batch", "CronJob") => Some(
                Mapping::pod_template(".spec.jobTemplate.spec.template").expect("a valid path"),
            ),
            _ => None,
        }
    }

    /// A mapping from its parts, each `None` meaning the `PodSpec`-able default (as a
    /// servicebinding.io ClusterWorkloadResourceMapping's version entry says); an empty
    /// `containers` means the `PodSpec`-able containers and init containers.
    pub fn new(
        annotations: Option<&str>,
        containers: &[ContainerPaths<'_>],
        volumes: Option<&str>,
    ) -> Result<Mapping, PathError> {
        let default = Mapping::pod_spec_able();
        Ok(Mapping {
            annotations: annotations
                .map(Path::parse_fixed)
                .transpose()?
                .unwrap_or(default.annotations),
            volumes: volumes
                .map(Path::parse_fixed)
                .transpose()?
                .unwrap_or(default.volumes),
            containers: if containers.is_empty() {
                default.containers
            } else {
                containers
                    .iter()
                    .map(ContainerMapping::parse)
                    .collect::<Result<_, _>>()?
            },
        })
    }
}
