//! The prompts of the decode benchmarks (`decode`, `tree_decode`), by name.

/// A code-editing request that repeats its input (n-gram drafts pay there), a class whose
/// repeated assignments continue in several ways (several earlier occurrences: n-gram trees
/// pay there), a function to complete, and prose.
pub fn prompt_text(name: &str) -> Result<&'static str, String> {
    Ok(match name {
        "code-edit" => {
            "def mean(values):\n    total = 0\n    count = 0\n    for v in values:\n        \
             total += v\n        count += 1\n    if count == 0:\n        return 0.0\n    \
             return total / count\n\n\n# The same function, with `total` renamed to `acc`:\n\
             def mean(values):\n    acc = 0\n"
        }
        "fields" => {
            "class Point:\n    def __init__(self, x, y, z):\n        self.x = x\n        \
             self.y = y\n        self.z = z\n\n    def scale(self, f):\n        self.x = self.x * f\n        \
             self.y = self.y * f\n        self.z = self.z * f\n\n    def shift(self, d):\n        \
             self.x = self.x + d\n"
        }
        "python" => "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "prose" => "The history of the printing press begins",
        other => {
            return Err(format!(
                "unknown prompt {other:?}: code-edit, fields, python or prose"
            ))
        }
    })
}
