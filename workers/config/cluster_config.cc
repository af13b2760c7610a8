#include "workers/config/cluster_config.h"

namespace dray {

std::vector<ConfigKey> ClusterConfigKeys(ClusterConfig& c) {
  return {
      Key("cluster.nodes", c.nodes, "an integer"),
      Key("cluster.listen", c.listen, "HOST:PORT"),
      Key("cluster.token_file", c.token_file, "a path"),
      Key("cluster.tls_cert", c.tls_cert, "a path"),
      Key("cluster.tls_key", c.tls_key, "a path"),
      Key("cluster.tls_ca", c.tls_ca, "a path"),
      Key("cluster.tls_mutual", c.tls_mutual, "true or false"),
  };
}

}  // namespace dray
