// ClusterConfig: the `cluster` section of `dray train` and `dray serve`
// configuration files, the YAML keys beside the --nodes, --listen,
// --token-file and --tls-* flags (cli/cluster_commands.h; a flag given on
// the command line wins over its key):
//
//   cluster:
//     nodes: 2
//     listen: controller:29400
//     token_file: /run/secrets/dray-token
//     tls_cert: /etc/dray/tls/tls.crt
//     tls_key: /etc/dray/tls/tls.key
//     tls_ca: /etc/dray/tls/ca.crt
//     tls_mutual: true
#ifndef DRAY_WORKERS_CONFIG_CLUSTER_CONFIG_H_
#define DRAY_WORKERS_CONFIG_CLUSTER_CONFIG_H_

#include <string>
#include <vector>

#include "workers/config/yaml_config.h"

namespace dray {

struct ClusterConfig {
  int nodes = 1;
  std::string listen;  // empty: the workers run on this machine
  std::string token_file;
  std::string tls_cert, tls_key, tls_ca;
  bool tls_mutual = false;
};

// ClusterConfigKeys: cluster.nodes, cluster.listen, cluster.token_file,
// cluster.tls_cert, cluster.tls_key, cluster.tls_ca, cluster.tls_mutual.
std::vector<ConfigKey> ClusterConfigKeys(ClusterConfig& c);

}  // namespace dray

#endif  // DRAY_WORKERS_CONFIG_CLUSTER_CONFIG_H_
