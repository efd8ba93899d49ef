#pragma once

// RAII over the HDF5 C API (parallel build). Every call that fails throws
// io::h5::Error with the file, the object path and HDF5's own error stack.
// Files opened with a communicator use MPI-IO; their dataset writes and reads
// are collective (every rank of the communicator calls them).

#include <ditrl/error.hpp>

#include <ATen/core/Tensor.h>
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ditrl::io::h5 {

class Error : public ditrl::Error {
 public:
  using ditrl::Error::Error;
};

// Owns one HDF5 identifier and closes it with the matching H5*close.
// Closing a file opened on several ranks is collective: it runs under the
// collective watchdog, and never while an exception unwinds (a peer may not
// be coming; the handle is dropped and the job ends in main()).
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  ~Handle();
  Handle(Handle&& other) noexcept : id_(other.id_), close_(other.close_), collective_close_(other.collective_close_) {
    other.id_ = H5I_INVALID_HID;
  }
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();

 protected:
  void set_collective_close(bool collective) { collective_close_ = collective; }
  bool collective_close() const { return collective_close_; }
  // Forgets the identifier without closing it (the caller closes it).
  void release() { id_ = H5I_INVALID_HID; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
  bool collective_close_ = false;
};

// For files of thousands of objects written once (checkpoints): the latest
// file format (compact object headers, indexed groups), metadata gathered in
// large blocks apart from the raw data, and (parallel) written collectively.
struct FileOptions {
  bool many_objects = false;
  // Datasets of at least 64 KiB start at a multiple of this many bytes
  // (0: packed), so that whole blocks of them can be written with O_DIRECT.
  int64_t data_alignment = 0;
};

class PropList : public Handle {
 public:
  using Handle::Handle;
  // File access: MPI-IO on `comm`, or the default serial driver for MPI_COMM_NULL.
  static PropList file_access(MPI_Comm comm, const FileOptions& options = {});
  // Dataset transfer: collective MPI-IO when `collective`.
  static PropList transfer(bool collective);
};

class Dataspace : public Handle {
 public:
  using Handle::Handle;
  static Dataspace simple(const std::vector<hsize_t>& dims, const std::vector<hsize_t>& max_dims = {});
  static Dataspace scalar();
  std::vector<hsize_t> dims() const;
  void select_hyperslab(const std::vector<hsize_t>& offset, const std::vector<hsize_t>& count);
  void select_none();
};

const char* dtype_name(c10::ScalarType dtype);

struct DatasetOptions {
  std::vector<hsize_t> chunk;     // empty = contiguous layout
  std::vector<hsize_t> max_dims;  // H5S_UNLIMITED entries make it extendible (needs chunk)
  bool fletcher32 = false;        // checksum every chunk (needs chunk)
  // Space allocated at creation and no fill values ever written: for
  // datasets whose every element the caller writes. Creation then does no
  // data I/O, and a parallel file's ranks may write their parts independently.
  bool preallocate = false;
};

// Shared by files, groups and datasets: attributes and naming.
class Object : public Handle {
 public:
  Object() = default;
  Object(hid_t id, Closer close, std::string file, std::string path, MPI_Comm comm)
      : Handle(id, close), file_(std::move(file)), path_(std::move(path)), comm_(comm) {}

  const std::string& file_name() const { return file_; }
  const std::string& path() const { return path_; }
  // Opened through MPI-IO: dataset transfers are collective, and so is every
  // call that changes metadata (creating objects, writing attributes), which
  // parallel HDF5 may turn into MPI collectives (a variable-length attribute
  // write barriers): they run under the collective watchdog.
  bool parallel() const { return comm_ != MPI_COMM_NULL; }
  MPI_Comm comm() const { return comm_; }
  std::string context() const;  // "file:path" for messages

  bool has_attr(const std::string& name) const;
  void set_attr(const std::string& name, const std::string& value);
  void set_attr(const std::string& name, const char* value) { set_attr(name, std::string(value)); }
  void set_attr(const std::string& name, int64_t value);
  void set_attr(const std::string& name, double value);
  void set_attr(const std::string& name, const std::vector<int64_t>& value);
  std::string string_attr(const std::string& name) const;
  int64_t int_attr(const std::string& name) const;

 protected:
  std::string child_path(const std::string& name) const;

 private:
  std::string file_;
  std::string path_;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

class Dataset : public Object {
 public:
  using Object::Object;

  std::vector<hsize_t> shape() const;
  c10::ScalarType dtype() const;
  // Whole dataset. Collective in a parallel file: every rank passes the
  // same data and rank 0's lands (ranks other than 0 select nothing).
  void write(const at::Tensor& tensor);
  at::Tensor read() const;
  // Rows [offset, offset + rows(tensor)) along dimension 0. `collective`
  // only matters in a parallel file; a rank with zero rows still calls.
  void write_rows(int64_t offset, const at::Tensor& rows, bool collective = true);
  at::Tensor read_rows(int64_t offset, int64_t count, bool collective = false) const;
  // Elements [flat_begin, flat_begin + values.numel()) of the dataset in
  // row-major order, whatever its rank: how a rank writes and reads its
  // slice of a flattened parameter. Collective in a parallel file (a rank
  // with an empty range still calls).
  void write_flat_range(int64_t flat_begin, const at::Tensor& values);
  // Where a contiguous dataset with allocated storage keeps its data in the
  // file: a flat range of it is one byte range there, which a writer can fill
  // without HDF5 (no collective, no selection per write).
  int64_t file_offset() const;
  at::Tensor read_flat_range(int64_t flat_begin, int64_t count, bool collective = true) const;
  // Resizes dimension 0 of an extendible dataset (grow or truncate).
  void extend(hsize_t rows);
};

class Group : public Object {
 public:
  using Object::Object;

  bool exists(const std::string& path) const;   // any depth, no error when absent
  Group create_group(const std::string& path);  // intermediate groups are created
  Group open_group(const std::string& path) const;
  Group require_group(const std::string& path);
  Dataset create_dataset(const std::string& path, c10::ScalarType dtype, const std::vector<hsize_t>& dims,
                         const DatasetOptions& options = {});
  Dataset open_dataset(const std::string& path) const;
  std::vector<std::string> children() const;  // link names, sorted
  // 1-D datasets of variable-length UTF-8 strings (prompt texts).
  void write_strings(const std::string& path, const std::vector<std::string>& values);
  std::vector<std::string> read_strings(const std::string& path) const;
};

class File : public Group {
 public:
  using Group::Group;
  enum class Mode { ReadOnly, ReadWrite };
  // Truncates an existing file. comm = MPI_COMM_NULL opens it serially;
  // otherwise the call is collective over comm.
  static File create(const std::string& path, MPI_Comm comm = MPI_COMM_NULL, const FileOptions& options = {});
  static File open(const std::string& path, Mode mode = Mode::ReadOnly, MPI_Comm comm = MPI_COMM_NULL);
  // A read-only file from a copy of its bytes held in memory (HDF5's core
  // driver): nothing on disk is opened or locked. `name` labels messages.
  static File open_image(const std::string& name, const std::string& bytes);
  void flush();
  // Closes now (collective in a parallel file) and raises when HDF5 could not
  // write the file's metadata; closing twice is a no-op.
  void close();

 private:
  void mark_collective();
};

// A rank's hyperslab of a 2-D dataset [global_rows, cols]: writes `rows`
// (shape [n, cols]) at row_offset, collectively. Creates the dataset when
// absent (every rank passes the same global_rows and dtype).
void write_rows_collective(Group& group, const std::string& path, int64_t global_rows, const at::Tensor& rows,
                           int64_t row_offset);

// An extendible 1-D float64 dataset appended one value at a time (metrics).
class Series {
 public:
  static Series open_or_create(Group& group, const std::string& path);
  void append(double value);
  // Row `row` = value, the series then `row` + 1 long (rows in between are
  // left to the caller).
  void set(int64_t row, double value);
  int64_t size() const;
  std::vector<double> read() const;

 private:
  explicit Series(Dataset dataset) : dataset_(std::move(dataset)) {}
  Dataset dataset_;
};

}  // namespace ditrl::io::h5
