#include <ditrl/error.hpp>
#include <ditrl/io/tensor_dump.hpp>

#include <ATen/ATen.h>

namespace ditrl::io {

namespace {

void require_plain_name(const std::string& what, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    fail("tensor dump: {} '{}' must be a non-empty name without '/'", what, name);
}

std::vector<hsize_t> dims_of(const at::Tensor& t) {
  std::vector<hsize_t> dims;
  for (int64_t d : t.sizes()) dims.push_back(static_cast<hsize_t>(d));
  return dims;
}

H5I_type_t object_type(const h5::Group& group, const std::string& name) {
  const hid_t id = H5Oopen(group.id(), name.c_str(), H5P_DEFAULT);
  if (id < 0) fail("tensor dump {}: cannot open '{}'", group.context(), name);
  const H5I_type_t type = H5Iget_type(id);
  H5Oclose(id);
  return type;
}

std::vector<std::string> children_of_type(const h5::Group& group, H5I_type_t wanted, const char* layout_level) {
  std::vector<std::string> names;
  for (const std::string& name : group.children()) {
    if (object_type(group, name) != wanted)
      fail("tensor dump {}/{}: expected a {} here (layout /<side>/<key>/<module>/<tensor>)", group.context(), name,
           layout_level);
    names.push_back(name);
  }
  return names;
}

// bf16/fp16 bits stored as 16-bit integers (h5py has no bf16 type).
at::Tensor read_16bit_integer_as(const h5::Dataset& d, c10::ScalarType dtype) {
  std::vector<int64_t> sizes;
  for (hsize_t s : d.shape()) sizes.push_back(static_cast<int64_t>(s));
  at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(at::kShort));
  if (out.numel() > 0) {
    h5::Handle type(H5Dget_type(d.id()), H5Tclose);
    h5::Handle native(H5Tget_native_type(type.id(), H5T_DIR_ASCEND), H5Tclose);
    if (H5Dread(d.id(), native.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data_ptr()) < 0)
      fail("tensor dump {}: cannot read the stored 16-bit values", d.context());
  }
  return out.view(dtype);
}

}  // namespace

TensorDumpWriter::TensorDumpWriter(const std::string& path) : file_(h5::File::create(path)) {
  file_.set_attr("format", "ditrl-tensor-dump-1");
}

void TensorDumpWriter::write(const std::string& side, const std::string& key, const std::string& module,
                             const std::string& tensor, const at::Tensor& value) {
  for (const auto& [what, name] :
       {std::pair{"side", &side}, std::pair{"key", &key}, std::pair{"module", &module}, std::pair{"tensor", &tensor}})
    require_plain_name(what, *name);
  const at::Tensor data = value.detach().to(at::kCPU).contiguous();
  h5::Group group = file_.require_group("/" + side + "/" + key + "/" + module);
  std::string name = tensor;
  for (int call = 1; group.exists(name); ++call) name = tensor + ".call" + std::to_string(call);
  h5::Dataset d = group.create_dataset(name, data.scalar_type(), dims_of(data));
  if (data.numel() > 0) d.write(data);
  d.set_attr("seq", next_seq_[side]++);
  d.set_attr("dtype", h5::dtype_name(data.scalar_type()));
}

std::vector<DumpEntry> list_tensor_dump(const h5::File& file, const std::string& side) {
  if (!file.exists("/" + side)) {
    const std::vector<std::string> present = file.children();
    fail("tensor dump {}: no side '{}' (the file holds: {})", file.file_name(), side,
         present.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(present, ", ")));
  }
  const h5::Group root = file.open_group("/" + side);
  std::vector<DumpEntry> entries;
  for (const std::string& key : children_of_type(root, H5I_GROUP, "key group")) {
    const h5::Group k = root.open_group(key);
    for (const std::string& module : children_of_type(k, H5I_GROUP, "module group")) {
      const h5::Group m = k.open_group(module);
      for (const std::string& tensor : children_of_type(m, H5I_DATASET, "tensor dataset")) {
        const h5::Dataset d = m.open_dataset(tensor);
        entries.push_back({key, module + "/" + tensor, d.has_attr("seq") ? d.int_attr("seq") : -1});
      }
    }
  }
  return entries;
}

at::Tensor read_dumped_tensor(const h5::File& file, const std::string& side, const DumpEntry& entry) {
  const h5::Dataset d = file.open_dataset("/" + side + "/" + entry.key + "/" + entry.path);
  const std::string dtype = d.has_attr("dtype") ? d.string_attr("dtype") : "";
  h5::Handle type(H5Dget_type(d.id()), H5Tclose);
  if (H5Tget_class(type.id()) == H5T_INTEGER && H5Tget_size(type.id()) == 2 && (dtype == "bf16" || dtype == "fp16"))
    return read_16bit_integer_as(d, dtype == "bf16" ? at::kBFloat16 : at::kHalf);
  return d.read();
}

}  // namespace ditrl::io
