// Metadata values and tensor-info helpers.
#include <climits>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"

namespace ds4::gguf {

const char *value_type_name(ValueType t) {
    switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
    }
    return "?";
}

namespace {
Value make_unsigned(ValueType t, uint64_t v) {
    Value x;
    x.type = t;
    x.u = v;
    return x;
}
Value make_signed(ValueType t, int64_t v) {
    Value x;
    x.type = t;
    x.i = v;
    return x;
}
Value make_float(ValueType t, double v) {
    Value x;
    x.type = t;
    x.f = v;
    return x;
}
}  // namespace

Value Value::u8(uint8_t v) { return make_unsigned(ValueType::U8, v); }
Value Value::u16(uint16_t v) { return make_unsigned(ValueType::U16, v); }
Value Value::u32(uint32_t v) { return make_unsigned(ValueType::U32, v); }
Value Value::u64(uint64_t v) { return make_unsigned(ValueType::U64, v); }
Value Value::i8(int8_t v) { return make_signed(ValueType::I8, v); }
Value Value::i16(int16_t v) { return make_signed(ValueType::I16, v); }
Value Value::i32(int32_t v) { return make_signed(ValueType::I32, v); }
Value Value::i64(int64_t v) { return make_signed(ValueType::I64, v); }
Value Value::f32(float v) { return make_float(ValueType::F32, v); }
Value Value::f64(double v) { return make_float(ValueType::F64, v); }

Value Value::boolean(bool v) {
    Value x;
    x.type = ValueType::BOOL;
    x.b = v;
    return x;
}

Value Value::str(std::string v) {
    Value x;
    x.type = ValueType::STRING;
    x.s = std::move(v);
    return x;
}

Value Value::array(ValueType elem, std::vector<Value> items) {
    Value x;
    x.type = ValueType::ARRAY;
    x.elem_type = elem;
    x.arr = std::move(items);
    return x;
}

Value Value::u32_array(const std::vector<uint32_t> &v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (uint32_t e : v) items.push_back(u32(e));
    return array(ValueType::U32, std::move(items));
}

Value Value::i32_array(const std::vector<int32_t> &v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (int32_t e : v) items.push_back(i32(e));
    return array(ValueType::I32, std::move(items));
}

Value Value::f32_array(const std::vector<float> &v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (float e : v) items.push_back(f32(e));
    return array(ValueType::F32, std::move(items));
}

Value Value::str_array(const std::vector<std::string> &v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (const auto &e : v) items.push_back(str(e));
    return array(ValueType::STRING, std::move(items));
}

bool Value::is_integer() const {
    switch (type) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
    case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64:
        return true;
    default:
        return false;
    }
}

int64_t Value::as_int() const {
    switch (type) {
    case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64:
        if (u > static_cast<uint64_t>(INT64_MAX)) failf("gguf: %s value %llu does not fit in int64", value_type_name(type), static_cast<unsigned long long>(u));
        return static_cast<int64_t>(u);
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
        return i;
    default:
        failf("gguf: %s value is not an integer", value_type_name(type));
    }
}

double Value::as_float() const {
    switch (type) {
    case ValueType::F32: case ValueType::F64:
        return f;
    case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64:
        return static_cast<double>(u);
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
        return static_cast<double>(i);
    default:
        failf("gguf: %s value is not a number", value_type_name(type));
    }
}

int64_t TensorInfo::nelements() const {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;   // the reader and writer reject overflowing shapes
    return n;
}

int64_t TensorInfo::rows() const {
    if (ne.empty() || ne[0] == 0) return 0;
    return nelements() / ne[0];
}

}  // namespace ds4::gguf
