// cache: the on-disk kernel cache (compiled objects, plans and their texts).
//
// Layout, under the cache directory (FLOWJIT_CACHE_DIR, default
// ~/.cache/flowjit):
//
//   <dir>/<key[0:2]>/<key>/   one entry per key, published complete:
//       meta.json              job, signature, source, target, build, times,
//                              hits, sizes, and {bytes, sha256} of each file
//       object.o               the ELF relocatable object
//       plan.txt               runtime::Plan::serialize(): the launch records,
//                              CPU ranges or GPU grids included
//       ir_traced.txt          IR before optimization
//       ir_optimized.txt       IR after the pass pipeline
//       fusion.txt             the fusion plan (which values in which kernel)
//       kernels.txt            loop-level kernel descriptions
//       llvm.ll                the optimized LLVM IR (for `flowjit-cache show`)
//       ...                    files of a target's own (CacheEntry::extra_files);
//                              GPU entries: kernels.ptx, and the cubin (empty
//                              without ptxas) as object.o
//   <dir>/tmp/                 private staging directories and entries being
//                              deleted
//   <dir>/lock                 taken (flock) while evicting
//   <dir>/hmac.key             this user's secret (64 hex digits, 0600),
//                              made on first use; authenticates entries
//
// Contracts:
//  * Publication is one rename(2) of a fully written staging directory onto
//    <dir>/<key[0:2]>/<key>. A rename that finds the key present fails, and
//    the existing entry is kept (both are equally good). Entries are not
//    fsynced (only hmac.key is): after a crash an entry may be short, which
//    its checksums catch (damaged: dropped and recompiled).
//  * Readers trust nothing: every file read is checked against the size and
//    SHA-256 recorded in meta.json; a mismatch makes the entry "damaged".
//  * An entry is native code this process will run, so it must also be
//    authentic: meta.json carries an HMAC-SHA256, under <dir>/hmac.key, of
//    the key and every file's size and checksum. An entry copied from
//    another cache or planted by someone else fails it and is recompiled.
//  * Directories are made 0700 and files 0600. A cache root, entry
//    directory or file that is not owned by this user or is writable by its
//    group or others is "untrusted": never read, never removed. Files are
//    opened without following links, and only regular files (a FIFO or a
//    device is refused, never waited on).
//  * meta.json is written and read with llvm/Support/JSON.h: keys sorted,
//    so its files (and the MAC's list of them) are in name order; a file
//    that does not parse, is not UTF-8 or nests deeper than 32 levels is
//    damaged. SHA-256 is runtime/sha256.h, not LLVM's: runtime/ (the TCP
//    store's handshake) must not link LLVM, and one implementation serves
//    both.
//  * meta.json is rewritten only to update hits and last_used, under flock
//    on the entry directory, by writing a new file and renaming it over the
//    old, so a reader sees the old or the new file, never a mix.
//  * Removal (eviction, damage) first renames the entry into tmp/, so no
//    reader ever sees a half-deleted entry.
// The key is computed by cache_key(); this module stores bytes and knows
// nothing of plans or objects.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace flowjit::jit {

// Everything that decides the generated code. Each part is length-prefixed
// in the hash, so no two different part lists hash the same text.
struct CacheKeyParts {
  std::string ir_optimized;
  std::string fusion_plan;
  std::string kernels;
  std::string plan;  // the plan before codegen (buffers, arena offsets)
  std::string target;
  std::string llvm_version;
  std::string build_id;
  std::string version;
};

// 64 hex digits.
std::string cache_key(const CacheKeyParts& parts);

// An entry as it is written.
struct CacheEntry {
  std::string key;
  std::vector<char> object;
  std::string plan;
  std::string ir_traced, ir_optimized, fusion_plan, kernels, llvm_ir;
  // More payload files, written, listed and checksummed like the others
  // (names: letters, digits, '.', '_', '-').
  std::vector<std::pair<std::string, std::string>> extra_files;
  // metadata
  std::string job_name, signature, source, target;
  std::string llvm_version, build_id, version;
  std::vector<std::string> inputs, outputs;  // printed tensor types
  int64_t arena_bytes = 0;
  int64_t num_kernels = 0;
  double compile_seconds = 0;  // the whole compile_job
  double codegen_seconds = 0;  // LLVM emit + optimize + codegen
};

// What a lookup returns: the parts needed to run, checksummed.
struct CacheHit {
  std::vector<char> object;
  std::string plan;
  std::string llvm_ir;             // only when asked for
  std::vector<std::string> extra;  // the extra files asked for, in that order
  int64_t hits = 0;                // before this one
};

// An entry as the cache tool sees it (`flowjit-cache verify`, `show`):
// read with lookup()'s checks but without its side effects (nothing is
// removed, touched or created; a missing hmac.key is a problem here, not
// made).
struct EntryReport {
  // meta.json when it parses as an object that names this key and whose
  // known fields have their types (the JSON text, to show); "" otherwise,
  // and `error` says why.
  std::string meta;
  int64_t meta_bytes = 0;
  std::string error;
  std::string target;          // meta.json's, when it can be shown
  int64_t num_kernels = -1;    // meta.json's, when it can be shown
  bool authenticated = false;  // its MAC is this cache's
  // Everything lookup() would refuse, all of it (not only the first):
  // ownership and modes, the MAC, a file missing, unlisted, of another
  // size or checksum, or not UTF-8 text. Empty: lookup() would read it.
  std::vector<std::string> problems;
};

class DiskCache {
 public:
  // max_bytes <= 0 selects default_cache_max_bytes().
  DiskCache(std::string dir, int64_t max_bytes);

  const std::string& dir() const { return dir_; }
  int64_t max_bytes() const { return max_bytes_; }
  std::string entry_dir(const std::string& key) const;

  // Why the cache directory must not be used at all ("" when it may): it
  // exists but is not owned by this user or is writable by group or others.
  std::string untrusted_root() const;

  enum class Found { Miss, Hit, Damaged, Untrusted };
  // Reads the entry for `key`. A damaged entry (unparsable metadata, a
  // missing file, a size or checksum mismatch, a MAC that this cache's key
  // did not make, text that is not UTF-8) is removed and `why` says what
  // was wrong. Untrusted (someone else's entry, directory or file, a link,
  // a FIFO; or no key can be read or made): left alone, `why` says why.
  // `extra`: names of CacheEntry::extra_files that must be present too.
  Found lookup(const std::string& key, bool want_llvm_ir, CacheHit& hit, std::string& why,
               const std::vector<std::string>& extra = {});

  // The entry for `key` as EntryReport says; `extra_for_target(target)`:
  // the CacheEntry::extra_files an entry of that target must list too.
  EntryReport inspect(const std::string& key,
                      const std::function<std::vector<std::string>(const std::string&)>&
                          extra_for_target = nullptr) const;
  // One listed file of the entry for `key`, read as lookup() reads it (no
  // link, only a regular file this user owns); with `verify`, checked
  // against meta.json's size and SHA-256. False with `why` when it cannot
  // be read or fails the check.
  bool read_listed(const std::string& key, const std::string& name, bool verify, std::string& out,
                   std::string& why) const;

  // Counts a use: hits += 1, last_used = now. Best effort (a read-only cache
  // is not an error).
  void touch(const std::string& key);

  enum class Stored { Published, AlreadyPresent, Failed };
  // Writes `e` into a private staging directory and publishes it with one
  // rename. Failed: the cache cannot be written (`why` says why);
  // nothing is left behind.
  Stored store(const CacheEntry& e, std::string& why);

  // Removes the entry for `key` if present. Returns whether it removed one.
  bool remove(const std::string& key);

  // Removes least-recently-used entries (and stale staging directories)
  // until the cache holds at most max_bytes; never removes `keep`. Returns
  // the number of entries removed.
  int evict(const std::string& keep = "");

  // Total bytes of all entries (as evict() counts them).
  int64_t total_bytes() const;

 private:
  std::string unique_tmp_name(const std::string& what) const;
  // Reads <dir>/hmac.key, or makes it (0600, 32 random bytes, published
  // with link(2) so that concurrent first users agree on one key).
  bool load_secret(std::string& why);
  std::string secret_;

  std::string dir_;
  int64_t max_bytes_;
};

// SHA-256 (16 hex digits) of the binary this code was loaded from (_C.so,
// or the test executable). Part of every key next to the configure-time
// build id, which a rebuild without re-running CMake leaves unchanged: a
// code-generator change must never be answered with an object the old
// generator made. Computed once per process.
const std::string& loaded_binary_id();

// ~/.cache/flowjit ($XDG_CACHE_HOME/flowjit when that is set).
std::string default_cache_dir();
int64_t default_cache_max_bytes();  // 1 GiB
// "1073741824", "512M", "1G", "2GiB", "64k": bytes, or -1 when unparsable.
int64_t parse_byte_size(const std::string& text);

// Records that `dir` cannot be written; true the first time for that dir in
// this process (the caller warns once).
bool note_unwritable_cache(const std::string& dir);
bool is_unwritable_cache(const std::string& dir);

// Whether `s` is well-formed UTF-8 as Python's strict decoder sees it.
bool valid_utf8(std::string_view s);
// `s` with each byte that is not part of well-formed UTF-8 written as \xNN:
// paths and entry texts go into messages and Python strings through this.
std::string printable_text(std::string_view s);

}  // namespace flowjit::jit
