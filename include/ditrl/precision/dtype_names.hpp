#pragma once

// The dtypes as the deck names them (precision.master, reduce, forward,
// [[precision.override]] dtype, `--dtype` of forward and export) and the
// boundary input choices (precision.inputs). Header-only: the deck reader
// (config/) parses the names into these values.

#include <ditrl/name_table.hpp>

#include <c10/core/ScalarType.h>

namespace ditrl::precision {

inline constexpr NameTable<c10::ScalarType, 3> kDtypeNames{
    {{"fp32", c10::ScalarType::Float}, {"bf16", c10::ScalarType::BFloat16}, {"fp16", c10::ScalarType::Half}}};

// What one boundary input of the DiT is cast to (InputPolicy, precision/dtype.hpp):
// the forward dtype, a fixed dtype, or its own dtype.
enum class InputDtype { Default, Fp32, Bf16, Fp16, Passthrough };

inline constexpr NameTable<InputDtype, 5> kInputDtypeNames{{{"default", InputDtype::Default},
                                                            {"fp32", InputDtype::Fp32},
                                                            {"bf16", InputDtype::Bf16},
                                                            {"fp16", InputDtype::Fp16},
                                                            {"passthrough", InputDtype::Passthrough}}};

}  // namespace ditrl::precision
