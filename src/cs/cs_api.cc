// The HiXL CS C API (hixl/hixl_cs.h) over cs::Server and cs::Client.
//
// Handles are numbers from one counter, never reused, looked up in a table
// of live handles (kind, owner, object) before use: NULL, foreign, stale and
// destroyed handles are PARAM_INVALID and never dereferenced. Servers,
// clients and batches are held by shared pointers, so a call that looked one
// up keeps it alive while a Destroy on another thread removes it.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "capi/last_error.h"
#include "cs/cs_client.h"
#include "cs/cs_server.h"
#include "hixl/hixl_cs.h"

namespace {

using hixl::Status;
using hixl::cs::Client;
using hixl::cs::Server;

enum class Kind { kServer, kClient, kServerMem, kClientMem, kBatch };

struct Entry {
  Kind kind = Kind::kServer;
  uint64_t owner = 0;  // the server or client handle a child belongs to
  std::shared_ptr<Server> server;
  std::shared_ptr<Client> client;
  Server::Mem* server_mem = nullptr;
  Client::LocalMem* client_mem = nullptr;
  std::shared_ptr<Client::Batch> batch;
};

std::mutex g_mu;
std::unordered_map<uint64_t, Entry> g_handles;
uint64_t g_next = 1;  // guarded by g_mu

uint64_t Id(void* h) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(h)); }
void* Handle(uint64_t id) { return reinterpret_cast<void*>(static_cast<uintptr_t>(id)); }

// Records a handle; 0 when it belongs to an owner that was destroyed
// meanwhile (the child would outlive it in the table).
uint64_t Add(Entry e) {
  std::lock_guard<std::mutex> l(g_mu);
  if (e.owner != 0 && g_handles.count(e.owner) == 0) return 0;
  uint64_t id = g_next++;
  g_handles.emplace(id, std::move(e));
  return id;
}
HixlStatus Gone(const char* what) {
  hixl::capi::LastError() = std::string("FAILED: the ") + what + " was destroyed meanwhile";
  return HIXL_FAILED;
}

bool Find(void* h, Kind kind, Entry& out) {
  std::lock_guard<std::mutex> l(g_mu);
  auto it = g_handles.find(Id(h));
  if (it == g_handles.end() || it->second.kind != kind) return false;
  out = it->second;
  return true;
}

// Removes a handle and every handle it owns.
void RemoveWithChildren(uint64_t id) {
  std::lock_guard<std::mutex> l(g_mu);
  g_handles.erase(id);
  for (auto it = g_handles.begin(); it != g_handles.end();) {
    it = it->second.owner == id ? g_handles.erase(it) : std::next(it);
  }
}

HixlStatus Fail(HixlStatus code, std::string msg) {
  hixl::capi::LastError() = std::move(msg);
  return code;
}
HixlStatus Invalid(const std::string& what) {
  return Fail(HIXL_PARAM_INVALID, "PARAM_INVALID: " + what);
}
HixlStatus From(const Status& s) {
  if (s.ok()) return HIXL_SUCCESS;
  hixl::capi::LastError() = s.ToString();
  return static_cast<HixlStatus>(s.code());
}

bool FindServer(HixlServerHandle h, Entry& e) { return Find(h, Kind::kServer, e); }
bool FindClient(HixlClientHandle h, Entry& e) { return Find(h, Kind::kClient, e); }

HixlStatus PostAsync(HixlClientHandle client, hixl::TransferOp op, uint32_t list_num,
                     const HixlOneSideOpDesc* desc_list, CompleteHandle* complete_handle) {
  Entry c;
  if (!FindClient(client, c)) return Invalid("client is NULL or not a live client handle");
  if (complete_handle == nullptr) return Invalid("complete_handle is NULL");
  uint32_t n = c.client->unqueried.load();
  do {
    if (n >= HIXL_CS_MAX_ASYNC_BATCHES) {
      return Fail(HIXL_RESOURCE_EXHAUSTED,
                  "RESOURCE_EXHAUSTED: " + std::to_string(n) +
                      " async batches are not queried to their end yet (at most " +
                      std::to_string(HIXL_CS_MAX_ASYNC_BATCHES) + ")");
    }
  } while (!c.client->unqueried.compare_exchange_weak(n, n + 1));
  std::shared_ptr<Client::Batch> b;
  Status s = c.client->PostAsync(op, desc_list, list_num, b);
  if (!s.ok()) {
    c.client->unqueried.fetch_sub(1);
    return From(s);
  }
  Entry e;
  e.kind = Kind::kBatch;
  e.owner = Id(client);
  e.batch = std::move(b);
  const uint64_t id = Add(std::move(e));
  if (id == 0) {
    c.client->unqueried.fetch_sub(1);
    return Gone("client");  // Shutdown stops the batch
  }
  *complete_handle = Handle(id);
  return HIXL_SUCCESS;
}

}  // namespace

extern "C" {

HixlStatus HixlCSServerCreate(const HixlServerDesc* desc, const HixlServerConfig* config,
                              HixlServerHandle* server) {
  if (desc == nullptr) return Invalid("desc is NULL");
  if (server == nullptr) return Invalid("server is NULL");
  std::unique_ptr<Server> s;
  Status st = Server::Create(*desc, config, s);
  if (!st.ok()) return From(st);
  Entry e;
  e.kind = Kind::kServer;
  e.server = std::shared_ptr<Server>(std::move(s));
  *server = Handle(Add(std::move(e)));
  return HIXL_SUCCESS;
}

HixlStatus HixlCSServerRegMem(HixlServerHandle server, const char* mem_tag, const CommMem* mem,
                              MemHandle* mem_handle) {
  Entry s;
  if (!FindServer(server, s)) return Invalid("server is NULL or not a live server handle");
  if (mem_handle == nullptr) return Invalid("mem_handle is NULL");
  Server::Mem* m = nullptr;
  Status st = s.server->RegMem(mem_tag, mem, m);
  if (!st.ok()) return From(st);
  Entry e;
  e.kind = Kind::kServerMem;
  e.owner = Id(server);
  e.server_mem = m;
  const uint64_t id = Add(std::move(e));
  if (id == 0) return Gone("server");
  *mem_handle = Handle(id);
  return HIXL_SUCCESS;
}

HixlStatus HixlCSServerListen(HixlServerHandle server, uint32_t backlog) {
  Entry s;
  if (!FindServer(server, s)) return Invalid("server is NULL or not a live server handle");
  return From(s.server->Listen(backlog));
}

HixlStatus HixlCSServerUnregMem(HixlServerHandle server, MemHandle mem_handle) {
  Entry s;
  if (!FindServer(server, s)) return Invalid("server is NULL or not a live server handle");
  Entry m;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_handles.find(Id(mem_handle));
    if (it == g_handles.end() || it->second.kind != Kind::kServerMem) {
      return Invalid("mem_handle is NULL, unregistered or not a server memory handle");
    }
    if (it->second.owner != Id(server)) return Invalid("mem_handle belongs to another server");
    m = it->second;
    g_handles.erase(it);
  }
  return From(s.server->UnregMem(m.server_mem));
}

HixlStatus HixlCSServerDestroy(HixlServerHandle server) {
  Entry s;
  if (!FindServer(server, s)) return Invalid("server is NULL or not a live server handle");
  RemoveWithChildren(Id(server));
  return From(s.server->Shutdown());
}

HixlStatus HixlCSClientCreate(const HixlClientDesc* desc, const HixlClientConfig* config,
                              HixlClientHandle* client) {
  if (desc == nullptr) return Invalid("desc is NULL");
  if (client == nullptr) return Invalid("client is NULL");
  std::unique_ptr<Client> c;
  Status st = Client::Create(*desc, config, c);
  if (!st.ok()) return From(st);
  Entry e;
  e.kind = Kind::kClient;
  e.client = std::shared_ptr<Client>(std::move(c));
  *client = Handle(Add(std::move(e)));
  return HIXL_SUCCESS;
}

HixlStatus HixlCSClientConnect(HixlClientHandle client, uint32_t timeout_ms) {
  Entry c;
  if (!FindClient(client, c)) return Invalid("client is NULL or not a live client handle");
  return From(c.client->Connect(timeout_ms));
}

HixlStatus HixlCSClientGetRemoteMem(HixlClientHandle client, CommMem** mem_list,
                                    char*** mem_tag_list, uint32_t* list_num, uint32_t timeout_ms) {
  (void)timeout_ms;
  Entry c;
  if (!FindClient(client, c)) return Invalid("client is NULL or not a live client handle");
  if (mem_list == nullptr || mem_tag_list == nullptr || list_num == nullptr) {
    return Invalid("mem_list, mem_tag_list and list_num must not be NULL");
  }
  return From(c.client->RemoteMem(mem_list, mem_tag_list, list_num));
}

HixlStatus HixlCSClientRegMem(HixlClientHandle client, const char* mem_tag, const CommMem* mem,
                              MemHandle* mem_handle) {
  Entry c;
  if (!FindClient(client, c)) return Invalid("client is NULL or not a live client handle");
  if (mem_handle == nullptr) return Invalid("mem_handle is NULL");
  Client::LocalMem* m = nullptr;
  Status st = c.client->RegMem(mem_tag, mem, m);
  if (!st.ok()) return From(st);
  Entry e;
  e.kind = Kind::kClientMem;
  e.owner = Id(client);
  e.client_mem = m;
  const uint64_t id = Add(std::move(e));
  if (id == 0) return Gone("client");
  *mem_handle = Handle(id);
  return HIXL_SUCCESS;
}

HixlStatus HixlCSClientUnregMem(HixlClientHandle client, MemHandle mem_handle) {
  Entry c;
  if (!FindClient(client, c)) return Invalid("client is NULL or not a live client handle");
  Entry m;
  {
    // Taken out of the table first: a second UnregMem of it finds nothing.
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_handles.find(Id(mem_handle));
    if (it == g_handles.end() || it->second.kind != Kind::kClientMem) {
      return Invalid("mem_handle is NULL, unregistered or not a client memory handle");
    }
    if (it->second.owner != Id(client)) return Invalid("mem_handle belongs to another client");
    m = it->second;
    g_handles.erase(it);
  }
  Status st = c.client->UnregMem(m.client_mem);
  if (!st.ok()) {
    std::lock_guard<std::mutex> l(g_mu);
    if (g_handles.count(Id(client)) != 0) g_handles.emplace(Id(mem_handle), m);  // still registered
    return From(st);
  }
  return HIXL_SUCCESS;
}

HixlStatus HixlCSClientBatchPutAsync(HixlClientHandle client, uint32_t list_num,
                                     const HixlOneSideOpDesc* desc_list,
                                     CompleteHandle* complete_handle) {
  return PostAsync(client, hixl::TransferOp::WRITE, list_num, desc_list, complete_handle);
}

HixlStatus HixlCSClientBatchGetAsync(HixlClientHandle client, uint32_t list_num,
                                     const HixlOneSideOpDesc* desc_list,
                                     CompleteHandle* complete_handle) {
  return PostAsync(client, hixl::TransferOp::READ, list_num, desc_list, complete_handle);
}

HixlStatus HixlCSClientBatchPutSync(HixlClientHandle client, uint32_t list_num,
                                    const HixlOneSideOpDesc* desc_list, uint32_t timeout_ms) {
  Entry c;
  if (!FindClient(client, c)) return Invalid("client is NULL or not a live client handle");
  return From(c.client->RunSync(hixl::TransferOp::WRITE, desc_list, list_num, timeout_ms));
}

HixlStatus HixlCSClientBatchGetSync(HixlClientHandle client, uint32_t list_num,
                                    const HixlOneSideOpDesc* desc_list, uint32_t timeout_ms) {
  Entry c;
  if (!FindClient(client, c)) return Invalid("client is NULL or not a live client handle");
  return From(c.client->RunSync(hixl::TransferOp::READ, desc_list, list_num, timeout_ms));
}

HixlStatus HixlCSClientQueryCompleteStatus(HixlClientHandle client, CompleteHandle complete_handle,
                                           HixlCompleteStatus* status) {
  Entry c;
  if (!FindClient(client, c)) return Invalid("client is NULL or not a live client handle");
  if (status == nullptr) return Invalid("status is NULL");
  Entry b;
  if (!Find(complete_handle, Kind::kBatch, b)) {
    return Invalid("complete_handle is NULL, already reported ended, or not a completion handle");
  }
  if (b.owner != Id(client)) return Invalid("complete_handle belongs to another client");
  std::string reason;
  HixlCompleteStatus st = c.client->Query(*b.batch, reason);
  if (st != HIXL_COMPLETE_STATUS_WAITING) {
    bool removed = false;
    {
      std::lock_guard<std::mutex> l(g_mu);
      removed = g_handles.erase(Id(complete_handle)) > 0;
    }
    // The end is reported once: a query that lost the race sees a released handle.
    if (!removed) return Invalid("complete_handle was reported ended by another query");
    c.client->unqueried.fetch_sub(1);
    if (st != HIXL_COMPLETE_STATUS_COMPLETED) hixl::capi::LastError() = reason;
  }
  *status = st;
  return HIXL_SUCCESS;
}

HixlStatus HixlCSClientDestroy(HixlClientHandle client) {
  Entry c;
  if (!FindClient(client, c)) return Invalid("client is NULL or not a live client handle");
  RemoveWithChildren(Id(client));
  c.client->Shutdown();
  return HIXL_SUCCESS;
}

HixlStatus HixlCSClientGetLinkStats(HixlClientHandle client, HixlCSLinkStats* out,
                                    uint32_t capacity, uint32_t* count) {
  Entry c;
  if (!FindClient(client, c)) return Invalid("client is NULL or not a live client handle");
  if (count == nullptr) return Invalid("count is NULL");
  if (out == nullptr && capacity > 0) return Invalid("out is NULL with capacity > 0");
  auto stats = c.client->Stats();
  *count = static_cast<uint32_t>(stats.size());
  if (capacity < stats.size()) {
    return Fail(HIXL_RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED: the client has " +
                                             std::to_string(stats.size()) + " links; capacity is " +
                                             std::to_string(capacity));
  }
  for (size_t i = 0; i < stats.size(); ++i) out[i] = stats[i];
  return HIXL_SUCCESS;
}

}  // extern "C"
