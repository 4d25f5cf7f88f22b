// The Gloo backend's communicator over a connected context (gloo_communicator.cc); the
// rendezvous that connects it is gloo_rendezvous.cc. Internal to dgc::comm: users connect with
// connect() (launch.h).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/context.h>

#include "dgc/comm/communicator.h"

namespace dgc::comm {

// A Communicator over `context`, whose pairs are connected. peer_by_address maps the socket
// addresses Gloo names in its errors to ranks; hosts[r] describes rank r ("host vm pid 4242").
std::unique_ptr<Communicator> make_gloo_communicator(
    std::shared_ptr<gloo::rendezvous::Context> context, Timeout default_timeout,
    std::map<std::string, int> peer_by_address, std::vector<std::string> hosts);

}  // namespace dgc::comm
