//! What the data-plane tests share: real cluster nodes on 127.0.0.1.

use shoal_cluster::{ClusterConfig, ClusterHandle};

/// A node of cluster `key` keeping its state in `dir`, dialling `peers`.
pub async fn node(
    dir: &tempfile::TempDir,
    key: &str,
    peers: Vec<libp2p::Multiaddr>,
) -> ClusterHandle {
    shoal_cluster::start(ClusterConfig {
        state_dir: dir.path().to_path_buf(),
        cluster_key: key.into(),
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
        peers,
        mdns: false,
        api_url: None,
        models: vec![],
        backend: "test".into(),
        machine: None,
    })
    .await
    .unwrap()
}
