// TargetId: what a backend generates code for, as data. The disk-cache key
// and entry, the cache tool and the reports see it as text, written by
// str() only: nothing builds, splices or parses target text elsewhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flowjit::codegen {

struct TargetId {
  std::string triple;     // LLVM target triple: "x86_64-pc-linux-gnu", "nvptx64-nvidia-cuda"
  std::string processor;  // the CPU name ("znver3") or the SM ("sm_90")
  // Everything else that decides the code, in a fixed order: the CPU's
  // feature list, or name=value settings ("tf32=0", "math=builtin").
  std::vector<std::string> facts;
  // How the code runs, when it is not one device's whole job ("x2 devices",
  // "x4 mirrored"): written after a space, for entries only (never the key).
  std::string placement;

  // "triple;processor;fact;...[ placement]".
  std::string str() const {
    std::string s = triple + ";" + processor;
    for (const std::string& f : facts) s += ";" + f;
    if (!placement.empty()) s += " " + placement;
    return s;
  }
  bool operator==(const TargetId& o) const {
    return triple == o.triple && processor == o.processor && facts == o.facts &&
           placement == o.placement;
  }
};

// Where transcendental functions come from, for a backend with a choice
// (NVPTX; the CPU always uses codegen/mathlib).
enum class MathLibrary : uint8_t {
  Auto,       // libdevice when found, otherwise flowjit's own polynomials
  Libdevice,  // libdevice.10.bc, required (UserError when missing)
  Builtin,    // flowjit's polynomials (codegen/mathlib), no CUDA toolkit needed
};

}  // namespace flowjit::codegen
