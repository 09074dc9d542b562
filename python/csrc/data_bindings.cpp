// flowjit._C's data readers: OFRecord part files read and decoded by native
// threads for the data ops inside jobs (python/flowjit/_data_ops.py).
#include <pybind11/stl.h>

#include <cstring>

#include "ir/error.h"
#include "python/csrc/bindings.h"
#include "runtime/ofrecord.h"

namespace flowjit::python {

namespace ofr = runtime::ofrecord;

void register_data(py::module_& m) {
  py::class_<ofr::Reader, std::shared_ptr<ofr::Reader>>(m, "OFRecordReader")
      // fields: dicts with name, shape, dtype, truncate and, for an image
      // field, "image": a dict of ofrecord::Field::Image's members.
      .def(py::init([](std::vector<std::string> files, int64_t batch_size, bool shuffle,
                       int64_t shuffle_buffer, bool shuffle_after_epoch, uint64_t seed,
                       const std::vector<py::dict>& fields, int prefetch, int64_t rows_begin,
                       int64_t rows_end) {
             ofr::ReaderOptions o;
             o.files = std::move(files);
             o.batch_size = batch_size;
             o.shuffle = shuffle;
             o.shuffle_buffer = shuffle_buffer;
             o.shuffle_after_epoch = shuffle_after_epoch;
             o.seed = seed;
             o.prefetch = prefetch;
             o.rows_begin = rows_begin;
             o.rows_end = rows_end;
             for (const py::dict& d : fields) {
               ofr::Field f;
               f.name = d["name"].cast<std::string>();
               f.shape = d["shape"].cast<std::vector<int64_t>>();
               f.dtype = d["dtype"].cast<ir::DType>();
               f.truncate = d.contains("truncate") && d["truncate"].cast<bool>();
               if (d.contains("image") && !d["image"].is_none()) {
                 py::dict im = d["image"].cast<py::dict>();
                 f.is_image = true;
                 auto get = [&](const char* k, auto& v) {
                   if (im.contains(k)) v = im[k].cast<std::decay_t<decltype(v)>>();
                 };
                 get("bgr", f.image.bgr);
                 get("random_crop", f.image.random_crop);
                 get("area_min", f.image.area_min);
                 get("area_max", f.image.area_max);
                 get("ratio_min", f.image.ratio_min);
                 get("ratio_max", f.image.ratio_max);
                 get("attempts", f.image.attempts);
                 get("resize_h", f.image.resize_h);
                 get("resize_w", f.image.resize_w);
                 get("shorter", f.image.shorter);
                 get("crop_h", f.image.crop_h);
                 get("crop_w", f.image.crop_w);
                 get("pos_y", f.image.pos_y);
                 get("pos_x", f.image.pos_x);
               }
               o.fields.push_back(std::move(f));
             }
             return std::make_shared<ofr::Reader>(std::move(o));
           }),
           py::arg("files"), py::arg("batch_size"), py::arg("shuffle"), py::arg("shuffle_buffer"),
           py::arg("shuffle_after_epoch"), py::arg("seed"), py::arg("fields"),
           py::arg("prefetch") = 2, py::arg("rows_begin") = 0, py::arg("rows_end") = -1)
      // The next batch as numpy arrays, one per field (rows, *shape).
      .def("next",
           [](ofr::Reader& r) {
             std::vector<std::vector<char>> batch;
             {
               py::gil_scoped_release release;
               batch = r.next();
             }
             py::list out;
             const auto& o = r.options();
             for (size_t i = 0; i < o.fields.size(); ++i) {
               std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(o.rows())};
               for (int64_t d : o.fields[i].shape) shape.push_back(static_cast<py::ssize_t>(d));
               py::array a(to_numpy_dtype(o.fields[i].dtype), shape);
               std::memcpy(a.mutable_data(), batch[i].data(), batch[i].size());
               out.append(a);
             }
             return out;
           })
      .def_property_readonly("records_read", &ofr::Reader::records_read);

  m.def("ofrecord_jpeg_support", &ofr::jpeg_support);
  m.def("ofrecord_png_support", &ofr::png_support);

  // One framed OFRecord (int64 length + protobuf) from [(key, kind, values)],
  // kind one of "bytes", "float", "double", "int32", "int64".
  m.def("ofrecord_encode",
        [](const std::vector<std::tuple<std::string, std::string, py::object>>& features) {
          std::vector<std::pair<std::string, ofr::OwnedFeature>> fs;
          using K = ofr::Feature::Kind;
          for (const auto& [key, kind, values] : features) {
            ofr::OwnedFeature f;
            if (kind == "bytes") {
              f.kind = K::Bytes;
              for (auto v : values) f.bytes.push_back(v.cast<std::string>());
            } else if (kind == "float" || kind == "double") {
              f.kind = kind == "float" ? K::Float : K::Double;
              f.numbers = values.cast<std::vector<double>>();
            } else if (kind == "int32" || kind == "int64") {
              f.kind = kind == "int32" ? K::Int32 : K::Int64;
              f.ints = values.cast<std::vector<int64_t>>();
            } else {
              throw_user(ErrorKind::Value, "ofrecord_encode: feature '", key,
                         "': kind must be bytes, float, double, int32 or int64, got '", kind, "'");
            }
            fs.emplace_back(key, std::move(f));
          }
          std::string out;
          ofr::append_record(out, fs);
          return py::bytes(out);
        });
}

}  // namespace flowjit::python
