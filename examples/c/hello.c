/* The smallest jbdev program: format a volume, write durably, read back. */
#include <stdio.h>
#include <string.h>
#include "jbdev.h"

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "hello.img";
	jbdev_format_options fo;
	jbdev_volume *vol;
	char buf[6] = { 0 };

	jbdev_format_options_init(&fo);
	fo.size_bytes = 64 << 20;
	if (jbdev_create(path, &fo, NULL, &vol) < 0 ||
	    jbdev_write(vol, "hello", 6, 1000, JBDEV_WRITE_FUA) < 0 || /* durable on return */
	    jbdev_read(vol, buf, 6, 1000) < 0) {
		fprintf(stderr, "jbdev: %s\n", jbdev_last_error());
		return 1;
	}
	printf("%s\n", buf);
	return jbdev_close(vol) < 0;
}
