//! What one remote may cost the local API server for one follower (issue 37, item 1): the bytes
//! of the labels copied from its leader, the follower slices its endpoints make, the ports of
//! its Service and slices. Pure: judged on the desired objects, tested without I/O.
//!
//! Over the label limit the follower is written without the remote's labels changing: the
//! labels it carries stay as they were (none on a new follower), everything else follows the
//! remote. Over the slice or port limit the remote's export of that Service is skipped as a
//! whole (`Skip::TooManySlices`, `Skip::TooManyPorts`: see `follower`): what the follower has
//! of it is kept as it was. Both lose nothing the local cluster has, and both decide the same way for the same
//! remote objects and the same live follower.
use std::collections::BTreeMap;

/// Default of `--remote-max-label-bytes`: 16 KiB of label keys and values. The API server
/// allows any number of labels; the Services we know of carry well under 1 KiB.
pub const DEFAULT_LABEL_BYTES: u64 = 16 << 10;
/// Default of `--remote-max-slices-per-service`: 100 follower slices of one remote for one
/// Service, room for 100,000 endpoints of one port set (ours hold up to 1,000 each).
pub const DEFAULT_SLICES: u64 = 100;
/// Default of `--remote-max-service-updates-per-second`: ten updates of a remote's followers'
/// Services a second, in bursts of a hundred (see `state::rate`); a Helm upgrade relabelling a
/// hundred Services passes at once.
pub const DEFAULT_SERVICE_UPDATES: u64 = 10;
/// Default of `--remote-max-ports-per-service`: 100 ports on the Service, and 100 distinct
/// ports in its slices (kube-proxy programs every port of every endpoint on every node).
pub const DEFAULT_PORTS: u64 = 100;

/// The limits of one remote's cost per follower (0: no limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteLimits {
    /// bytes of the label keys and values copied from one leader
    pub label_bytes: u64,
    /// follower EndpointSlices one remote makes for one Service
    pub slices: u64,
    /// ports of one exported Service, and distinct ports named by its slices
    pub ports: u64,
    /// updates a second of the follower Services whose fields come from one remote
    pub service_updates: u64,
}

impl Default for WriteLimits {
    fn default() -> Self {
        Self {
            label_bytes: DEFAULT_LABEL_BYTES,
            slices: DEFAULT_SLICES,
            ports: DEFAULT_PORTS,
            service_updates: DEFAULT_SERVICE_UPDATES,
        }
    }
}

/// The labels of a leader that were over the label limit: none of them is copied now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelsHeld {
    /// how many labels would have been copied
    pub labels: usize,
    /// their keys' and values' bytes
    pub bytes: u64,
    pub limit: u64,
}

impl std::fmt::Display for LabelsHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "its {} labels take {} bytes, more than {} (--remote-max-label-bytes): the follower's labels are kept as they were",
            self.labels, self.bytes, self.limit
        )
    }
}

/// Bytes of a label map as the limit counts them: every key and value.
pub fn label_bytes(labels: &BTreeMap<String, String>) -> u64 {
    labels.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum()
}

fn over(used: u64, limit: u64) -> bool {
    limit > 0 && used > limit
}

impl WriteLimits {
    /// Whether the labels to copy (ours not among them) are over the label limit.
    pub fn labels(&self, copied: &BTreeMap<String, String>) -> Option<LabelsHeld> {
        let bytes = label_bytes(copied);
        over(bytes, self.label_bytes).then_some(LabelsHeld {
            labels: copied.len(),
            bytes,
            limit: self.label_bytes,
        })
    }

    /// Whether `ports` (of one remote's Service, or distinct in its slices) are over the port
    /// limit.
    pub fn ports_over(&self, ports: u64) -> bool {
        over(ports, self.ports)
    }

    /// Whether `slices` follower slices of one remote for one Service are over the slice limit.
    pub fn slices_over(&self, slices: u64) -> bool {
        over(slices, self.slices)
    }
}

#[cfg(test)]
mod tests;
