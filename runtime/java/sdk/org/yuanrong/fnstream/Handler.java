package org.yuanrong.fnstream;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonElement;
import com.google.gson.JsonNull;
import org.yuanrong.services.runtime.Context;

import java.io.IOException;
import java.lang.reflect.Constructor;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.stream.Stream;

/**
 * Resolves `pkg.Class::method` (or openYuanrong's `pkg.Class.method`) to a method taking
 * (event, Context), and converts the event to its first parameter's type as openYuanrong does:
 * a String gets the event's text, a gson type or POJO what gson makes of the event.
 */
final class Handler {
    static final Gson GSON = new GsonBuilder().serializeNulls().disableHtmlEscaping().create();

    /** Why the code cannot serve; the deploy is refused with the message. */
    static final class LoadError extends Exception {
        private static final long serialVersionUID = 1L;

        LoadError(String message) {
            super(message);
        }
    }

    final Method method;
    final Object target;
    private final Class<?> eventType;
    private static final Map<Class<?>, Object> INSTANCES = new ConcurrentHashMap<>();

    private Handler(Method method, Object target) {
        this.method = method;
        this.target = target;
        this.eventType = method.getParameterCount() == 0 ? null : method.getParameterTypes()[0];
    }

    static String[] split(String ref) throws LoadError {
        int colons = ref.lastIndexOf("::");
        if (colons > 0) {
            return new String[] {ref.substring(0, colons), ref.substring(colons + 2)};
        }
        int dot = ref.lastIndexOf('.');
        if (dot > 0) {
            return new String[] {ref.substring(0, dot), ref.substring(dot + 1)};
        }
        throw new LoadError("'" + ref + "' is not 'package.Class::method'");
    }

    private static Class<?> loadClass(String field, String name, String ref) throws LoadError {
        try {
            return Class.forName(name, true, Handler.class.getClassLoader());
        } catch (ClassNotFoundException | NoClassDefFoundError e) {
            throw new LoadError(field + " '" + ref + "': class '" + name + "' not found; classes in codePath: "
                    + userClasses());
        } catch (ExceptionInInitializerError e) {
            throw new LoadError(field + " '" + ref + "': the static initializer of class '" + name + "' raised "
                    + e.getCause());
        } catch (LinkageError e) {
            throw new LoadError(field + " '" + ref + "': class '" + name + "' cannot be loaded: " + e);
        }
    }

    /** One instance per class, shared by every invocation of this JVM (as openYuanrong's UDFManager). */
    private static Object instanceOf(Class<?> cls, String field, String ref) throws LoadError {
        Object existing = INSTANCES.get(cls);
        if (existing != null) {
            return existing;
        }
        try {
            Constructor<?> ctor = cls.getDeclaredConstructor();
            ctor.setAccessible(true);
            Object made = ctor.newInstance();
            Object raced = INSTANCES.putIfAbsent(cls, made);
            return raced != null ? raced : made;
        } catch (NoSuchMethodException e) {
            throw new LoadError(field + " '" + ref + "': class '" + cls.getName()
                    + "' needs a constructor without parameters (or make the method static)");
        } catch (InvocationTargetException e) {
            throw new LoadError(field + " '" + ref + "': the constructor of '" + cls.getName() + "' raised "
                    + e.getCause());
        } catch (ReflectiveOperationException e) {
            throw new LoadError(field + " '" + ref + "': cannot create '" + cls.getName() + "': " + e);
        }
    }

    private static boolean isHandlerSignature(Method m) {
        Class<?>[] p = m.getParameterTypes();
        return p.length == 2 && p[1].isAssignableFrom(Context.class);
    }

    private static boolean isHookSignature(Method m) {
        Class<?>[] p = m.getParameterTypes();
        return p.length == 0 || (p.length == 1 && p[0].isAssignableFrom(Context.class));
    }

    private static List<Method> methodsOf(Class<?> cls) {
        List<Method> out = new ArrayList<>();
        for (Class<?> c = cls; c != null && c != Object.class; c = c.getSuperclass()) {
            for (Method m : c.getDeclaredMethods()) {
                if (!m.isSynthetic()) {
                    out.add(m);
                }
            }
        }
        return out;
    }

    static String describe(Method m) {
        StringBuilder sb = new StringBuilder(m.getName()).append('(');
        Class<?>[] p = m.getParameterTypes();
        for (int i = 0; i < p.length; i++) {
            sb.append(i == 0 ? "" : ", ").append(p[i].getSimpleName());
        }
        return sb.append(')').toString();
    }

    /** The function's handler: DeployError-worthy messages name the class, method and candidates. */
    static Handler resolve(String ref) throws LoadError {
        String[] parts = split(ref);
        Class<?> cls = loadClass("handler", parts[0], ref);
        List<Method> named = new ArrayList<>();
        TreeSet<String> candidates = new TreeSet<>();
        for (Method m : methodsOf(cls)) {
            if (isHandlerSignature(m)) {
                candidates.add(describe(m));
            }
            if (m.getName().equals(parts[1])) {
                named.add(m);
            }
        }
        String listing = candidates.isEmpty() ? "none" : String.join(", ", candidates);
        if (named.isEmpty()) {
            throw new LoadError("handler '" + ref + "': class '" + cls.getName() + "' has no method '" + parts[1]
                    + "'; its methods with a handler signature (event, Context): " + listing);
        }
        Method chosen = chooseOverload(named, ref, cls);
        if (chosen != null) {
            return bind(chosen, cls, "handler", ref);
        }
        List<String> found = new ArrayList<>();
        for (Method m : named) {
            found.add(describe(m));
        }
        throw new LoadError("handler '" + ref + "': method " + String.join(", ", found) + " of class '"
                + cls.getName() + "' does not take (event, Context); its methods with a handler signature: " + listing);
    }

    /** How much an overload's event type is preferred: gson's JsonObject first (openYuanrong's signature),
     * then other gson types, String, other classes, Object last. */
    private static int rank(Class<?> event) {
        if (event == com.google.gson.JsonObject.class) {
            return 0;
        }
        if (JsonElement.class.isAssignableFrom(event)) {
            return 1;
        }
        return event == String.class ? 2 : event == Object.class ? 4 : 3;
    }

    /** Among overloads with a handler signature, the best-ranked one — never the JVM's (unspecified) method
     * order; two of the same rank (say Integer and Long events) refuse the deploy naming them. An override
     * and the method it overrides are one candidate (the subclass's, listed first by methodsOf). */
    private static Method chooseOverload(List<Method> named, String ref, Class<?> cls) throws LoadError {
        Method best = null;
        List<String> tied = new ArrayList<>();
        List<Class<?>> seen = new ArrayList<>();
        for (Method m : named) {
            if (!isHandlerSignature(m) || seen.contains(m.getParameterTypes()[0])) {
                continue;
            }
            seen.add(m.getParameterTypes()[0]);
            int r = rank(m.getParameterTypes()[0]);
            if (best == null || r < rank(best.getParameterTypes()[0])) {
                best = m;
                tied.clear();
                tied.add(describe(m));
            } else if (r == rank(best.getParameterTypes()[0])) {
                tied.add(describe(m));
            }
        }
        if (tied.size() > 1) {
            throw new LoadError("handler '" + ref + "': class '" + cls.getName() + "' has overloads "
                    + String.join(", ", new TreeSet<>(tied)) + " and none is preferred (JsonObject, then other "
                    + "gson types, then String, then other classes, then Object); rename one");
        }
        return best;
    }

    /** An initializer or preStop: `Class::method`, `pkg.Class.method` or a bare method of the handler's class. */
    static Handler resolveHook(String field, String ref, Class<?> handlerClass) throws LoadError {
        Class<?> cls;
        String name;
        if (!ref.contains(".") && !ref.contains("::")) {
            cls = handlerClass;
            name = ref;
        } else {
            String[] parts = split(ref);
            cls = loadClass(field, parts[0], ref);
            name = parts[1];
        }
        for (Method m : methodsOf(cls)) {
            if (m.getName().equals(name) && isHookSignature(m)) {
                return bind(m, cls, field, ref);
            }
        }
        throw new LoadError(field + " '" + ref + "': class '" + cls.getName() + "' has no method '" + name
                + "(Context)'");
    }

    private static Handler bind(Method m, Class<?> cls, String field, String ref) throws LoadError {
        m.setAccessible(true);
        Object target = Modifier.isStatic(m.getModifiers()) ? null : instanceOf(cls, field, ref);
        return new Handler(m, target);
    }

    /** The event as the handler's first parameter wants it. */
    Object convert(JsonElement event) {
        if (eventType == null) {
            return null;
        }
        JsonElement e = event == null ? JsonNull.INSTANCE : event;
        if (eventType == String.class) {
            if (e.isJsonNull()) {
                return "";
            }
            return e.isJsonPrimitive() && e.getAsJsonPrimitive().isString() ? e.getAsString() : e.toString();
        }
        if (eventType.isInstance(e)) {
            return e;
        }
        if (e.isJsonNull()) {
            return null;
        }
        return GSON.fromJson(e, eventType);
    }

    Object call(JsonElement event, Context ctx) throws Throwable {
        try {
            if (method.getParameterCount() == 0) {
                return method.invoke(target);
            }
            if (method.getParameterCount() == 1) {
                return method.invoke(target, ctx);
            }
            Object converted;
            try {
                converted = convert(event);
            } catch (RuntimeException e) {
                throw new IllegalArgumentException("the event cannot be converted to the handler's "
                        + eventType.getSimpleName() + " parameter: " + e.getMessage(), e);
            }
            return method.invoke(target, converted, ctx);
        } catch (InvocationTargetException e) {
            throw e.getCause();
        }
    }

    /** The result as JSON text: a String is a JSON string, anything else what gson makes of it. */
    static String encode(Object result) {
        if (result == null) {
            return "null";
        }
        if (result instanceof JsonElement) {
            return GSON.toJson((JsonElement) result);
        }
        return GSON.toJson(result);
    }

    Class<?> declaringClass() {
        return method.getDeclaringClass();
    }

    /** Class names under the classpath's directories (what a deploy error lists). */
    static String userClasses() {
        TreeSet<String> names = new TreeSet<>();
        String cp = System.getProperty("fnstream.usercp", "");
        for (String entry : cp.split(java.io.File.pathSeparator)) {
            if (entry.isEmpty()) {
                continue;
            }
            Path root = Paths.get(entry);
            if (!Files.isDirectory(root)) {
                continue;
            }
            try (Stream<Path> walk = Files.walk(root, 32)) {
                walk.filter(p -> p.toString().endsWith(".class") && !p.getFileName().toString().contains("$"))
                        .limit(200)
                        .forEach(p -> {
                            String rel = root.relativize(p).toString();
                            names.add(rel.substring(0, rel.length() - 6).replace(java.io.File.separatorChar, '.'));
                        });
            } catch (IOException ignored) {
                // an unreadable directory lists nothing
            }
        }
        if (names.isEmpty()) {
            return "none";
        }
        List<String> shown = new ArrayList<>(names);
        return String.join(", ", shown.subList(0, Math.min(20, shown.size())))
                + (shown.size() > 20 ? ", ..." : "");
    }
}
