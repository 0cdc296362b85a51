// Who listens at an engine address? One short connection: a probe message,
// the listening engine's ident in answer (control/protocol.h), then close.
// Nothing is linked and nothing needs authentication.
//
// The registry asks it when an engine name is held by an entry whose engine
// may be dead (engine/naming.cc): a refused connection, or an answer from
// another engine (another generation) or from something that is not a hixl
// engine, means the holder is gone; no answer in time, or a closed
// connection, proves nothing. hixl-info uses it to name what it reaches.
//
// Thread safety: a plain blocking function, callable from any thread.
#ifndef HIXL_ENGINE_PROBE_H_
#define HIXL_ENGINE_PROBE_H_

#include <string>

#include "control/protocol.h"

namespace hixl::engine {

struct ProbeResult {
  enum class Kind {
    kIdent,     // an engine answered: ident holds who
    kRefused,   // nothing listens there (ECONNREFUSED)
    kNotHixl,   // something answered, but not a hixl ident
    kNoAnswer,  // no connection or no answer within the timeout, or closed unanswered
  };
  Kind kind = Kind::kNoAnswer;
  control::Ident ident;
  std::string detail;  // what happened, for messages
  double rtt_us = 0;   // connect to answer, when one came
};

// address: "ip:port". timeout_ms bounds the whole probe (1..60000).
ProbeResult ProbeEngine(const std::string& address, int timeout_ms);

}  // namespace hixl::engine

#endif  // HIXL_ENGINE_PROBE_H_
